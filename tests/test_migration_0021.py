"""Migration 0021: the NOTIFY of a Django task's row inserted alone names its queue,
``"<id> <task path> <queue>"``; a workflow's row is still ``"<id> <kind>"``. Reversed, the
function is 0017's again (no queue named)."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_workflows import enqueue
from nexus_workflows.deferred.wakeup import CHANNEL, parse_new_work
from nexus_workflows.models import DeferredWork
from nexus_workflows.sql import postgresql
from tests.migrating import migrate
from tests.raw_connections import raw_connection
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

BEFORE = "0017_notify_resting_limited_kinds"
TASK_PATH = "tests.testapp.tasks.record"


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def row_id(result: Any) -> int:
    """The work row of a Django task's result (its result id is the row's dedupe key)."""
    return DeferredWork.objects.exclude(queue_name="").get(dedupe_key=result.id).pk


def payloads_of(*enqueues: Any) -> list[str]:
    """The payloads the calls ``enqueues`` send while a runner waits (the waiting lock
    held on a listening session), up to a marker sent after them."""
    with raw_connection() as listener, raw_connection() as sender:
        postgresql.listen(listener, CHANNEL)
        postgresql.hold_waiting_lock(listener)
        for call in enqueues:
            call()
        sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        payloads = []
        for notification in listener.notifies(timeout=5):
            if notification.payload == "marker":  # sent after the enqueues committed
                break
            payloads.append(notification.payload)
    return payloads


def test_a_task_row_names_its_queue_and_a_workflow_row_does_not(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1]).kind
    results: dict[str, Any] = {}
    payloads = payloads_of(
        lambda: results.update(email=tasks.record.using(queue_name="emails").enqueue("e")),
        lambda: results.update(default=tasks.record.enqueue("d")),
        lambda: results.update(workflow=enqueue(kind, {"key": 1})),
    )
    assert [parse_new_work(payload) for payload in payloads] == [
        (row_id(results["email"]), TASK_PATH, "emails"),
        (row_id(results["default"]), TASK_PATH, "default"),
        (int(results["workflow"]), kind, None),
    ]
    assert payloads[2] == f"{results['workflow']} {kind}"  # unchanged for workflows


def test_reversed_a_task_row_names_no_queue() -> None:
    migrate(BEFORE)
    try:
        results: dict[str, Any] = {}
        payloads = payloads_of(
            lambda: results.update(email=tasks.record.using(queue_name="emails").enqueue("e"))
        )
    finally:
        migrate(None)
    assert payloads == [f"{row_id(results['email'])} {TASK_PATH}"]

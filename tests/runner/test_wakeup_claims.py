"""The wake-up path's claims (rows a NOTIFY named, claimed by id): what one claim took is
handed out even when the next claim of the same wake-up fails.

Real PostgreSQL: another session holds a row lock on a Django task's row, and the
runner's connection waits at most 200 ms for it.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from nexus_workflows import enqueue
from nexus_workflows.database_errors import sqlstate
from nexus_workflows.deferred.inserts import insert_pending
from nexus_workflows.models import DeferredWork, Status
from tests.raw_connections import updates_wait_for_a_lock
from tests.runner.helpers import lane_claims

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def test_a_workflow_row_claimed_by_id_is_handed_out_when_the_tasks_claim_fails(
    register_workflow: Any,
) -> None:
    kind = register_workflow(noop, retry_schedule=[1]).kind
    workflow_id = int(enqueue(kind, {"key": "a"}) or 0)
    task_id = insert_pending(
        "default", kind="tasks.send", dedupe_key="t", trigger={}, now=timezone.now(), queue_name="default"
    )
    lanes, handed_out = lane_claims(kinds=[kind], queues=None)
    lanes.new_work(workflow_id, kind)
    lanes.new_work(task_id, "tasks.send")
    try:
        # The task row's UPDATE waits for a lock (a lock on the row itself is skipped now).
        with updates_wait_for_a_lock(DeferredWork, "NEW.queue_name <> ''"):
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 200")
            with pytest.raises(OperationalError) as raised:
                lanes.claim_notified(None)
    finally:
        connection.close()  # the session's lock_timeout goes with it
    assert sqlstate(raised.value) == "55P03"
    # The workflow's row was claimed before the task's claim waited too long: it is handed
    # out, not left processing unheld until STALE_AFTER.
    assert [work.id for work in handed_out] == [workflow_id]
    assert DeferredWork.objects.get(pk=workflow_id).status == Status.PROCESSING
    assert DeferredWork.objects.get(pk=task_id).status == Status.PENDING

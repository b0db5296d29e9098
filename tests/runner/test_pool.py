"""The pools' care of the connections a prepare opens with the ORM (``runner.pool``)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import override_settings

from nexus_workflows import enqueue
from nexus_workflows.deferred.runner.pool import IDLE_CHECK_AFTER
from nexus_workflows.models import Status
from tests.processes import wait_for
from tests.test_runner import row
from tests.test_runner_robustness import FAST, running

pytestmark = pytest.mark.django_db(transaction=True)


def record_session(seen: list[Any]) -> None:
    """The prepare's ORM connection, kept alive so that identity tells sessions apart."""
    connection.ensure_connection()
    seen.append(connection.connection)


def kind_recording_sessions(register_workflow: Any, mode: str, seen: list[Any]) -> str:
    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        record_session(seen)

    async def async_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await sync_to_async(record_session, thread_sensitive=True)(seen)

    return register_workflow(prepare if mode == "sync" else async_prepare, retry_schedule=[1]).kind


def run_two_attempts_apart(kind: str, seen: list[Any], seconds: float) -> None:
    """Two attempts on one worker, the second ``seconds`` after the first ran."""
    first = enqueue(kind, {"key": "first"})
    with override_settings(NEXUS_WORKFLOWS=FAST), running(kind, concurrency=1):
        wait_for(lambda: row(first).status == Status.DONE, timeout=30, what="the first attempt")
        ran_at = time.monotonic()
        wait_for(lambda: time.monotonic() - ran_at >= seconds, timeout=seconds + 5, what="time to pass")
        second = enqueue(kind, {"key": "second"})
        wait_for(lambda: row(second).status == Status.DONE, timeout=30, what="the second attempt")
    assert len(seen) == 2


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_prepares_connection_older_than_conn_max_age_is_replaced_before_the_next_attempt(
    register_workflow: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """As Django closes a request's connection past ``CONN_MAX_AGE`` at the next request's
    start, the runner does at the next attempt's: a project that lets connections live a
    minute (to spread them over replicas behind a balancer, say) gets that in a runner too."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 1)  # every thread's alias
    seen: list[Any] = []
    run_two_attempts_apart(kind_recording_sessions(register_workflow, mode, seen), seen, 1.2)
    assert seen[1] is not seen[0]


@pytest.mark.parametrize("max_age", [0, 600], ids=["zero", "ten-minutes"])
def test_a_prepares_connection_within_conn_max_age_or_with_zero_is_kept(
    register_workflow: Any, monkeypatch: pytest.MonkeyPatch, max_age: int
) -> None:
    """0 means "one request" in a web process; here the connection is kept for the thread's
    life instead (a new one per attempt would cost more than many attempts). Kept also
    across an idle check, which only asks whether it still answers."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", max_age)
    seen: list[Any] = []
    kind = kind_recording_sessions(register_workflow, "sync", seen)
    run_two_attempts_apart(kind, seen, IDLE_CHECK_AFTER + 0.2)
    assert seen[1] is seen[0]

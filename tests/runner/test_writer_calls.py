"""``JournalWriter.call``: a helper thread's statement (the wake-up listener's probe and its
runner-row update) on a journal writer's connection, so that thread holds none beyond
``DB_CONNECTIONS``. Such a call survives the writer's idle connection having died, is
failed by a stop that gives up on its writer, and a mode change runs no purge sweep on the
writer (its saves would wait). PostgreSQL: real sessions ended, real advisory locks."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection, connections
from django.test import override_settings

from nexus_workflows import enqueue
from nexus_workflows.deferred.runner import Runner, journal
from nexus_workflows.deferred.runner.journal import JournalWriter
from nexus_workflows.observability import observer
from tests.processes import wait_for
from tests.raw_connections import raw_connection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

#: An advisory lock the stuck call waits for (a key no app code uses).
_STUCK = 0x6E77_7273


def backend_pid() -> int:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def test_a_call_on_a_writer_whose_idle_connection_died_runs_on_a_new_one() -> None:
    """A restart or an idle-session timeout ends the writer's idle session: the call runs
    again on a new connection. Before, the listener's probe failed there ("wake-up probe
    could not be sent") and wake-ups came back only after one probe per dead writer."""
    writer = JournalWriter("default", 1)
    writer.start()
    try:
        first = writer.call(backend_pid)
        with raw_connection() as other:
            other.execute("SELECT pg_terminate_backend(%s)", [first])
        again = writer.call(backend_pid)
    finally:
        writer.stop()
    assert again != first


def test_a_stop_fails_a_helper_call_its_writer_is_stuck_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer is stuck on the call's statement (a silent network, here a lock another
    session holds): the stop gives up on it after its wait and fails the call, so the
    listener's thread does not wait for ever. Before, its caller stayed blocked."""
    monkeypatch.setattr(journal, "STOP_WAIT", 0.5)

    def stuck() -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [_STUCK])
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_STUCK])

    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["result"] = writer.call(stuck)
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            outcome["error"] = error

    writer = JournalWriter("default", 1)
    with raw_connection() as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [_STUCK])
        writer.start()
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        wait_for(
            lambda: writer._waiting.qsize() == 0 and caller.is_alive(), timeout=10, what="the call taken"
        )
        writer.stop()
        caller.join(5)
        assert not caller.is_alive()
        holder.execute("SELECT pg_advisory_unlock(%s)", [_STUCK])
    assert isinstance(outcome.get("error"), RuntimeError)
    assert "the runner stopped" in str(outcome["error"])


def test_a_wake_up_mode_change_runs_no_purge_sweep_on_a_journal_writer(
    register_workflow: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener's first mode change (at start, before the first beat) refreshed the
    runner's row and ran the first sweep, which purges, on the journal writer it now runs
    on: with one writer, the attempts' saves waited for the purge. The sweep is the
    heartbeat thread's."""
    sweeps: list[str] = []
    original = observer.Observer._sweep

    def sweep(self: Any) -> None:
        sweeps.append(threading.current_thread().name)
        original(self)

    monkeypatch.setattr(observer.Observer, "_sweep", sweep)
    kind = register_workflow(lambda t, c, save: save({"step": 1}), retry_schedule=[1]).kind
    enqueue(kind, {"key": "x"})
    settings = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.2, "STALE_AFTER": 5.0, "DB_CONNECTIONS": 4}
    with override_settings(NEXUS_WORKFLOWS={**settings, "WAKEUP_DATABASE": "direct"}):
        runner = Runner(kinds=[kind], install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            wait_for(lambda: runner.stats.done == 1 and sweeps, timeout=30, what="the work and a sweep")
            assert str(runner.wakeup_mode) == "listening"
        finally:
            runner.request_stop()
            thread.join(20)
            connection.close()
    assert sweeps[0] == "nexus-workflows-heartbeat"

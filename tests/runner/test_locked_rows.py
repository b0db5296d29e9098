"""A due row another session holds a lock on (a request's transaction that changed it and
has not committed, a project's ``select_for_update()``) holds up nothing: the runner's
claims skip it (``SKIP LOCKED``) and take it once the lock is gone. Before, the claim's
``UPDATE`` waited for the lock in the runner's main loop: no other work was claimed, no
outcome written, and SIGTERM went unanswered until the lock was released.

Nor does a *held* row another session locks: the heartbeat skips it and beats the rest,
and waits for its lock between beats, so it is the first to write the row once the lock
goes. Before, the beat waited for that one row, every other row of the runner went stale,
and a second runner reclaimed attempts that were still running (two executions at once).

Real runner processes on the test database, PostgreSQL and MariaDB (SQLite has no row
locks: one writer at a time, which a claim waits for up to its ``timeout``).
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.db.models.functions import Now

from nexus_workflows import enqueue
from nexus_workflows.clock import database_now
from nexus_workflows.models import DeferredWork, Status
from tests.processes import ManagePy, overlapping, read_intervals, wait_for
from tests.raw_connections import row_locked
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.needs("row_locks")]

FAST = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 2, "SHUTDOWN_GRACE": 1}


def done_keys() -> Counter[str]:
    return Counter(Ledger.objects.filter(kind="test-ledger").values_list("key", flat=True))


def locked_row_due(delay: float = 3.0) -> int:
    """A row of ``test-ledger`` due in ``delay`` seconds (so no claim takes it before the
    test locks it: the enqueue's commit, a new session and its lock fit in it on a busy
    machine too)."""
    work_id = enqueue("test-ledger", {"key": "locked"}, delay=delay)
    assert work_id is not None
    return int(work_id)


def wait_until_due(work_id: int) -> None:
    wait_for(
        lambda: DeferredWork.objects.due(Now()).filter(pk=work_id).exists(),
        timeout=10,
        what="the locked row to be due",
    )


def run_items(keys: list[str]) -> None:
    for key in keys:
        enqueue("test-ledger", {"key": key})
    wait_for(lambda: all(done_keys()[key] for key in keys), timeout=20, what=f"items {keys} to run")


def test_a_locked_due_row_holds_up_no_other_work_and_runs_once_released() -> None:
    process = ManagePy("runworkflows", "--kind", "test-ledger", settings=FAST)
    try:
        process.wait_for_output("runner started")
        locked = locked_row_due()
        with row_locked(DeferredWork, locked) as release:
            wait_until_due(locked)
            run_items([f"before-{n}" for n in range(3)])
            # Longer than STALE_AFTER: the runner claims (and skips the row) all along.
            threading.Event().wait(FAST["STALE_AFTER"] + 1)
            run_items([f"after-{n}" for n in range(3)])
            assert DeferredWork.objects.get(pk=locked).status == Status.PENDING
            release()
            wait_for(lambda: done_keys()["locked"], timeout=20, what="the released row to run")
        wait_for(
            lambda: DeferredWork.objects.get(pk=locked).status == Status.DONE,
            timeout=10,
            what="the released row to be done",
        )
        assert process.terminate() == 0
        output = process.output()
    finally:
        process.close()
    assert set(done_keys().values()) == {1}  # each ran once
    assert "database unavailable" not in output
    assert "did not pass" not in output


def test_sigterm_while_a_due_row_is_locked_stops_the_runner_promptly() -> None:
    process = ManagePy("runworkflows", "--kind", "test-ledger", settings=FAST)
    try:
        process.wait_for_output("runner started")
        locked = locked_row_due()
        with row_locked(DeferredWork, locked):
            wait_until_due(locked)
            run_items(["other"])  # the runner has claimed since the row was due
            # While the lock is held: the old claim waited for it, and SIGTERM with it.
            code = process.terminate(timeout=15)
            assert DeferredWork.objects.get(pk=locked).status == Status.PENDING
        output = process.output()
    finally:
        process.close()
    assert code == 0, output
    assert "runner stopped" in output


@pytest.mark.slow
def test_a_held_row_another_session_locks_holds_back_no_heartbeat_and_no_attempt_runs_twice(
    tmp_path: Path,
) -> None:
    settings = {"POLL_INTERVAL": 0.2, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 3, "SHUTDOWN_GRACE": 1}
    ledger = tmp_path / "ledger"
    until = tmp_path / "until"  # the attempts run until this file exists
    keys = ["x", "y1", "y2", "y3"]
    for key in keys:
        enqueue(
            "test-interval", {"key": key, "ledger": str(ledger), "seconds": 120, "until_file": str(until)}
        )
    ids = dict(DeferredWork.objects.values_list("dedupe_key", "pk"))
    args = ("runworkflows", "--kind", "test-interval", "--concurrency", "4")
    first = ManagePy(*args, settings=settings)
    second = None
    try:
        started = lambda: {interval.key for interval in read_intervals(ledger)} == set(keys)  # noqa: E731
        wait_for(started, timeout=30, what="the first runner to start all four")
        # Each row marked started (a beat's own statements) before the lock is taken.
        wait_for(
            lambda: not DeferredWork.objects.filter(started_at__isnull=True).exists(),
            timeout=10,
            what="start marks",
        )
        with row_locked(DeferredWork, ids["x"]):
            second = ManagePy(*args, settings=settings)
            second.wait_for_output("runner started")
            stale = timedelta(seconds=settings["STALE_AFTER"] + 1)
            wait_for(
                lambda: DeferredWork.objects.get(pk=ids["x"]).heartbeat_at < database_now("default") - stale,
                timeout=30,
                what="the locked row's heartbeat to be older than STALE_AFTER",
            )
            # The others kept their beat (the second runner polls every 0.2 s meanwhile).
            for key in ("y1", "y2", "y3"):
                row = DeferredWork.objects.get(pk=ids[key])
                assert row.heartbeat_at > database_now("default") - timedelta(
                    seconds=settings["STALE_AFTER"] / 2
                )
        # Released: the first runner's waiting beat writes the row before any stale claim.
        wait_for(
            lambda: DeferredWork.objects.get(pk=ids["x"]).heartbeat_at > database_now("default") - stale,
            timeout=10,
            what="the released row's heartbeat",
        )
        until.touch()
        wait_for(
            lambda: DeferredWork.objects.filter(status=Status.DONE).count() == 4, timeout=30, what="done"
        )
        first_output, second_output = first.output(), second.output()
    finally:
        for process in (first, second):
            if process is not None:
                process.terminate()
                process.close()
    intervals = read_intervals(ledger)
    assert overlapping(intervals) == []
    assert sorted(interval.key for interval in intervals) == keys  # each ran once, by the first
    assert {interval.pid for interval in intervals} == {first.pid}
    assert set(DeferredWork.objects.values_list("attempt", flat=True)) == {0}
    assert (
        "heartbeat waits for 1 item(s) whose row another session holds a lock on (test-interval #"
        in first_output
    )
    assert "heartbeat reached the 1 item(s) it waited for" in first_output
    assert "heartbeat failed" not in first_output
    assert "reclaimed" not in second_output


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["test-interval", "test-interval-async"])
def test_a_held_row_another_session_locks_holds_back_no_other_attempts_saves(
    tmp_path: Path, kind: str
) -> None:
    """One attempt's save meets its row locked by another session: the other attempts'
    saves go on and they end, while that save waits and is written once the lock goes.
    ``DB_CONNECTIONS`` 4 leaves one journal writer on PostgreSQL: on the old code its batch
    waited for the lock, and with it every other attempt's save, until the lock went."""
    settings = {**FAST, "STALE_AFTER": 10, "DB_CONNECTIONS": 4}
    ledger = tmp_path / "ledger"
    go_x, go_others = tmp_path / "go-x", tmp_path / "go-others"
    others = ["y1", "y2", "y3"]
    for key, go in [("x", go_x), *((key, go_others) for key in others)]:
        trigger = {"key": key, "ledger": str(ledger), "seconds": 120, "until_file": str(go), "steps": 5}
        enqueue(kind, {**trigger, "step_seconds": 0.02})
    ids = dict(DeferredWork.objects.values_list("dedupe_key", "pk"))
    process = ManagePy("runworkflows", "--kind", kind, "--concurrency", "4", settings=settings)
    try:
        started = lambda: {interval.key for interval in read_intervals(ledger)} == {"x", *others}  # noqa: E731
        wait_for(started, timeout=30, what="the runner to start all four")
        with row_locked(DeferredWork, ids["x"]) as release:
            go_x.touch()
            process.wait_for_output("waits for its row, which another session holds a lock on")
            go_others.touch()
            wait_for(
                lambda: (
                    DeferredWork.objects.filter(
                        pk__in=[ids[key] for key in others], status=Status.DONE
                    ).count()
                    == 3
                ),
                timeout=20,
                what="the other attempts to end while the lock is held",
            )
            assert DeferredWork.objects.get(pk=ids["x"]).checkpoints == {}
            release()
            wait_for(
                lambda: DeferredWork.objects.get(pk=ids["x"]).status == Status.DONE,
                timeout=20,
                what="x's end",
            )
        assert process.terminate() == 0
        output = process.output()
    finally:
        process.close()
    intervals = read_intervals(ledger)
    assert sorted(interval.key for interval in intervals) == ["x", *others]  # each ran once
    assert set(DeferredWork.objects.values_list("attempt", flat=True)) == {0}
    steps = {f"step{step}": True for step in range(5)}
    assert set(map(str, DeferredWork.objects.values_list("checkpoints", flat=True))) == {str(steps)}
    assert f"a save of {kind} #{ids['x']} waits for its row, which another session holds a lock on" in output
    assert "failed" not in output

"""A runner nothing but a signal stops: poison errors, failing writes, failing heartbeats,
database errors inside prepare, lost claims and the crash-loop guard (issue 20).

In-process runners on the real database; a real trigger (``write_blocker``) makes chosen
writes fail the way a constraint or a read-only primary would.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, OperationalError, connection
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from nexus_workflows import enqueue
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.history import describe_error
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.limits import LAST_ERROR_MAX_LENGTH, OUTAGE_RELEASES_MAX, UNSTARTED_LOSSES_MAX
from nexus_workflows.models import DeferredWork, Status
from tests.processes import wait_for
from tests.test_runner import make_due, row, run_once, stale

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.1, "STALE_AFTER": 1.0, "SHUTDOWN_GRACE": 2}


@contextmanager
def running(*kinds: str, concurrency: int = 2) -> Iterator[tuple[Runner, threading.Thread]]:
    """A runner in a thread of this process; stopped (and checked to stop) on exit."""
    runner = Runner(kinds=list(kinds), concurrency=concurrency, install_signal_handlers=False)
    thread = threading.Thread(target=runner.run, name="test-runner")
    thread.start()
    try:
        yield runner, thread
    finally:
        runner.request_stop()
        thread.join(15)
        connection.close()
    assert not thread.is_alive()


def in_mode(mode: str, prepare: Any) -> Any:
    """``prepare`` as is ("sync": the thread pool) or as an ``async def`` ("async": the
    runner's event loop) doing the same; for bodies that do not block."""
    if mode == "sync":
        return prepare

    async def async_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        prepare(trigger, checkpoints, save)

    return async_prepare


# --- 1. poison never spreads --------------------------------------------------------------


class StrReturnsBytes(Exception):
    def __str__(self) -> Any:
        return b"not text"


class StrRaises(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot render")


POISON = {
    "lone-surrogate": lambda: ValueError("cut emoji \ud83d here"),
    "nul": lambda: ValueError("before\x00after"),
    "one-megabyte": lambda: ValueError("x" * 1_000_000),
    "str-raises": StrRaises,
    "str-returns-bytes": StrReturnsBytes,
    "system-exit": lambda: SystemExit(3),
    "keyboard-interrupt": KeyboardInterrupt,
    "generator-exit": GeneratorExit,
    "surrogate-in-type-name": lambda: type("Bad\udc80Name", (Exception,), {})("boom\ud800"),
}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("poison", list(POISON))
def test_whatever_prepare_raises_only_its_own_item_fails(
    register_workflow: Any, poison: str, mode: str
) -> None:
    def sync_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        if trigger["key"] == "poison":
            raise POISON[poison]()

    kind = register_workflow(in_mode(mode, sync_prepare), retry_schedule=[1]).kind
    others = [enqueue(kind, {"key": f"ok-{n}"}) for n in range(5)]
    poisoned = enqueue(kind, {"key": "poison"})
    stats = run_once(kind, concurrency=2)
    assert (stats.done, stats.rescheduled) == (5, 1)
    assert {row(work_id).status for work_id in others} == {Status.DONE}
    work = row(poisoned)
    assert (work.status, work.attempt, work.claimed_at, work.heartbeat_at) == (Status.PENDING, 1, None, None)
    for text in (work.last_error, work.history[-1]["error"]):
        assert "\x00" not in text
        text.encode("utf-8")  # no lone surrogate survived
        assert len(text) <= LAST_ERROR_MAX_LENGTH


def test_describe_error_is_bounded_storable_text() -> None:
    assert describe_error(ValueError("a\x00b")) == "ValueError: a\ufffdb"
    assert describe_error(ValueError("x\ud800y")) == "ValueError: x?y"
    assert describe_error(StrReturnsBytes()) == "StrReturnsBytes: <the error's message could not be rendered>"
    assert len(describe_error(ValueError("x" * 1_000_000))) == LAST_ERROR_MAX_LENGTH


def test_a_failing_outcome_write_is_contained_to_its_item_and_retried(
    register_workflow: Any, write_blocker: Any, caplog: Any
) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    others = [enqueue(kind, {"key": f"ok-{n}"}) for n in range(6)]
    stuck = enqueue(kind, {"key": "stuck"})
    write_blocker.install("NEW.dedupe_key = 'stuck' AND NEW.status = 'done'")
    with (
        override_settings(NEXUS_WORKFLOWS=FAST),
        caplog.at_level(logging.ERROR, logger="nexus_workflows"),
        running(kind) as (runner, thread),
    ):
        wait_for(
            lambda: all(row(work_id).status == Status.DONE for work_id in others),
            timeout=10,
            what="the other items to be done",
        )
        # The write is retried, and fails again, while the runner goes on.
        wait_for(
            lambda: caplog.text.count("writing its outcome failed") >= 2,
            timeout=10,
            what="a retry that failed",
        )
        assert thread.is_alive()
        assert row(stuck).status == Status.PROCESSING  # held, still heart-beaten
        write_blocker.remove()
        wait_for(lambda: row(stuck).status == Status.DONE, timeout=10, what="the retried write")
    # Numbered as every other line is ("attempt 1 of 2"), not by the raw column (0).
    assert f"{kind} #{stuck} attempt 1 of 2: writing its outcome failed (" in caplog.text
    assert runner.stats.done == 7


def test_an_error_message_the_database_rejects_is_stored_as_its_type_alone(
    register_workflow: Any, write_blocker: Any
) -> None:
    class Upstream(Exception):
        pass

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        raise Upstream("this text is refused")

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    write_blocker.install("NEW.last_error LIKE '%refused%'")
    with override_settings(NEXUS_WORKFLOWS=FAST), running(kind):
        wait_for(lambda: row(work_id).attempt == 1, timeout=15, what="the fallback write")
    work = row(work_id)
    assert (work.attempt, work.last_error) == (1, "Upstream: (the message could not be stored)")


# --- 3. heartbeats survive any exception ----------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_heartbeats_survive_errors_and_a_runner_without_them_stops_claiming(
    register_workflow: Any, write_blocker: Any, caplog: Any, mode: str
) -> None:
    release_slow = threading.Event()
    runs: list[str] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        runs.append(trigger["key"])
        if trigger["key"] == "slow":
            release_slow.wait(20)

    async def async_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        runs.append(trigger["key"])
        deadline = time.monotonic() + 20
        while trigger["key"] == "slow" and not release_slow.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    kind = register_workflow(prepare if mode == "sync" else async_prepare, retry_schedule=[1]).kind
    slow = enqueue(kind, {"key": "slow"})
    # Heartbeat-only updates fail (InternalError on PostgreSQL, as on a read-only primary).
    heartbeat_only = (
        "NEW.heartbeat_at <> OLD.heartbeat_at AND NEW.updated_at = OLD.updated_at "
        "AND NEW.claim_token = OLD.claim_token"
    )
    with (
        override_settings(NEXUS_WORKFLOWS=FAST),
        caplog.at_level(logging.WARNING, logger="nexus_workflows"),
        running(kind) as (runner, thread),
    ):
        wait_for(lambda: runs == ["slow"], timeout=10, what="the slow attempt to start")
        write_blocker.install(heartbeat_only)
        wait_for(lambda: "not claiming until one succeeds" in caplog.text, timeout=10, what="the pause")
        quick = enqueue(kind, {"key": "quick"})
        # Polls go on meanwhile (every 0.05 s) until the slow attempt's own claim is stale.
        stale_slow = DeferredWork.objects.filter(pk=slow, heartbeat_at__lt=Now() - timedelta(seconds=1.0))
        wait_for(stale_slow.exists, timeout=10, what="the slow attempt's claim to go stale")
        assert row(quick).status == Status.PENDING  # not claimed while heartbeats fail
        assert runner.stats.reclaimed == 0  # nor its own stale attempt
        write_blocker.remove()
        wait_for(lambda: row(quick).status == Status.DONE, timeout=10, what="claiming to resume")
        release_slow.set()
        wait_for(lambda: row(slow).status == Status.DONE, timeout=10, what="the slow attempt")
        assert thread.is_alive()
    # Said once per outage, however many beats failed in it (each failed beat at DEBUG).
    assert caplog.text.count("heartbeat failed (") == 1
    failed = re.search(r"heartbeats work again, after (\d+) failed", caplog.text)
    assert failed is not None, caplog.text
    assert int(failed[1]) >= 2
    assert runs == ["slow", "quick"]  # the slow item ran once
    assert (row(slow).attempt, runner.stats.reclaimed) == (0, 0)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_queued_work_whose_claim_heartbeats_could_not_confirm_is_never_started(
    register_workflow: Any, write_blocker: Any, caplog: Any, mode: str
) -> None:
    """Heartbeats fail for longer than STALE_AFTER while work waits in the runner's queue
    behind a slow attempt; another runner reclaims it. When the slow attempt ends, the
    queued work must not start here too: two executions at once."""
    release_slow = threading.Event()
    runs: list[str] = []

    async def async_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        runs.append(trigger["key"])
        while trigger["key"] == "slow" and not release_slow.is_set():
            await asyncio.sleep(0.01)

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        runs.append(trigger["key"])
        if trigger["key"] == "slow":
            release_slow.wait(30)

    kind = register_workflow(prepare if mode == "sync" else async_prepare, retry_schedule=[1]).kind
    heartbeat_only = (
        "NEW.heartbeat_at <> OLD.heartbeat_at AND NEW.updated_at = OLD.updated_at "
        "AND NEW.claim_token = OLD.claim_token"
    )
    with override_settings(NEXUS_WORKFLOWS=FAST), caplog.at_level(logging.INFO, logger="nexus_workflows"):
        runner = Runner(kinds=[kind], concurrency=1, async_concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            # Quick work first, so the runner prefetches: it claims beyond its one slot.
            warm = [enqueue(kind, {"key": f"warm-{number}"}) for number in range(5)]
            wait_for(lambda: all(row(w).status == Status.DONE for w in warm), timeout=10, what="warm-up")
            slow = enqueue(kind, {"key": "slow"})
            wait_for(lambda: "slow" in runs, timeout=10, what="the slow attempt to start")
            queued = [enqueue(kind, {"key": f"queued-{number}"}) for number in range(3)]
            wait_for(
                lambda: all(row(q).status == Status.PROCESSING for q in queued),
                timeout=10,
                what="the queued work's claims",
            )
            write_blocker.install(heartbeat_only)
            # Another runner reclaims them once they are stale, and would run them.
            wait_for(
                lambda: all(row(q).heartbeat_at < timezone.now() - timedelta(seconds=1.2) for q in queued),
                timeout=10,
                what="the queued claims to go stale",
            )
            other = Claimer(kinds=[kind], using=runner.using, worker_id="other-runner")
            taken: list[Any] = []

            def reclaimed_all() -> bool:
                # Tried again as its stale checks would: a failing heartbeat's statement
                # locks the rows for a moment (then its trigger refuses it), and a reclaim
                # skips rows another session holds. Once, it met one and took none; once,
                # it took the queued work but not the slow item, which then ended here.
                taken.extend(other.claim_stale(10, stale_after=timedelta(seconds=1.0)))
                return {w.id for w in taken} >= {int(q) for q in [*queued, slow]}

            wait_for(reclaimed_all, timeout=10, what="the other runner to reclaim the slow and queued work")
            release_slow.set()
            wait_for(lambda: runner.stats.forfeited == 3, timeout=10, what="the queued claims to be given up")
            write_blocker.remove()
            assert "not starting 3 claimed item(s)" in caplog.text
            assert [key for key in runs if not key.startswith("warm")] == ["slow"]  # never the queued work
            # Nor does the log say they started (it did, as they were claimed).
            assert f"{kind} #{slow} attempt 1 of 2: started" in caplog.text
            assert [q for q in queued if f"{kind} #{q} attempt 1 of 2: started" in caplog.text] == []
            assert {row(q).claim_token for q in queued} <= {w.claim_token for w in taken}  # still the other's
            assert row(slow).status == Status.PROCESSING  # the other runner's too, now
        finally:
            release_slow.set()
            runner.request_stop()
            thread.join(15)
            connection.close()
    assert not thread.is_alive()


def test_an_attempt_whose_reserved_start_lapsed_is_released_without_counting(register_workflow: Any) -> None:
    """The claim reserved a start of the rate window; before the attempt could start,
    another runner's attempt took the window's only start (the reservation had lapsed
    waiting for a thread). prepare never ran: the attempt must not count."""
    from nexus_workflows.clock import database_now
    from nexus_workflows.flow.claiming import window_name
    from nexus_workflows.models import FlowWindowSlot
    from nexus_workflows.signals import attempt_started

    runs: list[str] = []
    kind = register_workflow(
        lambda t, c, s: runs.append(t["key"]), retry_schedule=[1], rate_limit=(1, 1.0)
    ).kind
    window = FlowWindowSlot.objects.filter(name=window_name(kind))
    taken_over: list[int] = []

    def another_runner_starts_first(sender: Any, *, id: int, **details: Any) -> None:
        if not taken_over:
            taken_over.append(id)
            window.update(started_at=database_now("default"))

    work_id = enqueue(kind, {"key": "a"})
    attempt_started.connect(another_runner_starts_first)
    try:
        with override_settings(NEXUS_WORKFLOWS=FAST), running(kind) as (runner, _):
            wait_for(lambda: row(work_id).status == Status.DONE, timeout=15, what="the released work to run")
    finally:
        attempt_started.disconnect(another_runner_starts_first)
    work = row(work_id)
    assert (runs, work.attempt, runner.stats.released, runner.stats.rescheduled) == (["a"], 0, 1, 0)
    assert [(e["outcome"], e["reason"], e["attempt"]) for e in work.history] == [
        ("released", "reserved start lapsed", 0)
    ]


def test_an_attempt_starting_while_heartbeats_fail_does_not_say_they_work_again(
    register_workflow: Any, write_blocker: Any, caplog: Any
) -> None:
    """An attempt that starts while heartbeats fail wakes the heartbeat thread for its
    start marker; one that ended first leaves nothing to mark, and that turn writes
    nothing. It is no heartbeat: it must not end the outage ("heartbeats work again"),
    nor make the next failed beat a WARNING again."""
    release_slow = threading.Event()

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        release_slow.wait(20)

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    slow = enqueue(kind, {"key": "slow"})
    heartbeat_only = (
        "NEW.heartbeat_at <> OLD.heartbeat_at AND NEW.updated_at = OLD.updated_at "
        "AND NEW.claim_token = OLD.claim_token"
    )

    def failed_beats() -> int:
        return sum(1 for r in caplog.records if r.getMessage().startswith("heartbeat failed ("))

    # Beats a second apart, and no pause within the test (STALE_AFTER / 2 is 10 s).
    settings = {**FAST, "HEARTBEAT_INTERVAL": 1.0, "STALE_AFTER": 20.0}
    with (
        override_settings(NEXUS_WORKFLOWS=settings),
        caplog.at_level(logging.DEBUG, logger="nexus_workflows.deferred.runner"),
        running(kind) as (runner, _thread),
    ):
        wait_for(lambda: row(slow).status == Status.PROCESSING, timeout=10, what="the slow attempt")
        write_blocker.install(heartbeat_only)
        wait_for(lambda: failed_beats() >= 1, timeout=10, what="a failed beat")
        runner._heartbeat.started()  # what an attempt's start does (it ended: nothing to mark)
        wait_for(lambda: failed_beats() >= 2, timeout=10, what="the next failed beat")
        said = [(r.levelname, r.getMessage()) for r in caplog.records]
        write_blocker.remove()
        release_slow.set()
        wait_for(lambda: row(slow).status == Status.DONE, timeout=10, what="the slow attempt done")
    assert not [m for _, m in said if m.startswith("heartbeats work again")], said
    # One WARNING (the blocker's error: InternalError on PostgreSQL, IntegrityError on SQLite).
    warned = [m for level, m in said if level == "WARNING" and m.startswith("heartbeat failed (")]
    assert len(warned) == 1, said
    assert re.fullmatch(r"heartbeat failed \((InternalError|IntegrityError)\); retrying every 1s", warned[0])


# --- 4. an unreachable database does not consume the schedule ------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_database_outage_inside_prepare_releases_the_attempt_a_bounded_number_of_times(
    register_workflow: Any, mode: str
) -> None:
    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    kind = register_workflow(in_mode(mode, prepare), retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    for _ in range(OUTAGE_RELEASES_MAX):
        stats = run_once(kind)
        assert (stats.released, stats.rescheduled) == (1, 0)
        work = row(work_id)
        assert (work.status, work.attempt) == (Status.PENDING, 0)
        assert work.next_attempt_at <= timezone.now() + timedelta(seconds=2)  # due soon
        assert work.history[-1] == {
            **work.history[-1],
            "outcome": "released",
            "reason": "database unavailable",
            "attempt": 0,
        }
        make_due(work_id)
    # A workflow that always fails this way still walks its schedule and ends.
    assert run_once(kind).rescheduled == 1
    assert row(work_id).attempt == 1
    make_due(work_id)
    for _ in range(OUTAGE_RELEASES_MAX):
        run_once(kind)
        make_due(work_id)
    assert run_once(kind).abandoned == 1
    assert row(work_id).status == Status.ABANDONED


@pytest.mark.postgresql
def test_a_session_ended_idle_in_a_transaction_releases_the_attempt(register_workflow: Any) -> None:
    """PostgreSQL ends a session left idle in a transaction longer than
    ``idle_in_transaction_session_timeout`` (an operator's setting); the next statement
    raises IdleInTransactionSessionTimeout, an InternalError. The session is gone, as
    after ``pg_terminate_backend``: an outage, not a failure of the work."""
    from django.db import transaction

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL idle_in_transaction_session_timeout = '50ms'")
            threading.Event().wait(0.5)  # idle in the transaction: the server ends the session
            cursor.execute("SELECT 1")

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    stats = run_once(kind)
    work = row(work_id)
    assert (stats.released, stats.rescheduled, work.status, work.attempt) == (1, 0, Status.PENDING, 0)
    assert work.history[-1]["reason"] == "database unavailable"
    assert work.last_error.startswith("InternalError: terminating connection due to idle-in-transaction")


@pytest.mark.postgresql
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_read_only_session_is_replaced_after_the_attempt_it_failed(
    register_workflow: Any, mode: str
) -> None:
    """A session opened while the database was read-only stays read-only (it keeps the
    default it began with) however usable it looks: after the attempt it failed, the pool
    (the async pool's shared ORM thread too) takes a new one, so the next attempt runs,
    rather than failing until its outage releases run out and the schedule is walked."""
    from asgiref.sync import sync_to_async

    if os.environ.get("DIRECT_DATABASE_URL"):
        # Through PgBouncer in transaction mode a client has no session of its own: the SET
        # and the UPDATE may meet different server sessions (the UPDATE then simply works),
        # and the SET would stay on a pooled one for other tests. Run on the direct legs.
        pytest.skip("needs a session of its own; the PgBouncer leg pools sessions by transaction")

    runs: list[str] = []

    def write() -> None:
        with connection.cursor() as cursor:
            if not runs:  # as if this session had begun while the database was read-only
                cursor.execute("SET SESSION default_transaction_read_only = on")
            runs.append("ran")
            cursor.execute(f"UPDATE {DeferredWork._meta.db_table} SET last_error = last_error WHERE false")
        connection.close()  # written: this thread's session is not left to the test database

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        write()

    async def async_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await sync_to_async(write, thread_sensitive=True)()

    kind = register_workflow(prepare if mode == "sync" else async_prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    with override_settings(NEXUS_WORKFLOWS=FAST), running(kind):
        wait_for(
            lambda: row(work_id).status == Status.DONE or row(work_id).attempt > 0,
            timeout=30,
            what="the work to be done (or its attempt counted)",
        )
    work = row(work_id)
    assert (work.status, work.attempt, len(runs)) == (Status.DONE, 0, 2)
    assert [(e["outcome"], e["reason"]) for e in work.history] == [("released", "database unavailable")]


def database_error_of(setting: str, statement: str) -> DatabaseError:
    """The error ``statement`` raises on this test's database under ``SET LOCAL setting``."""
    from django.db import transaction

    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL {setting}")
            cursor.execute(statement)
    except DatabaseError as error:
        return error
    raise AssertionError(f"{statement!r} succeeded under {setting!r}")


@pytest.mark.postgresql
def test_an_outage_is_described_by_the_drivers_error_type_and_never_its_text() -> None:
    from nexus_workflows.deferred.runner.unavailable import describe_unavailable

    cancelled = database_error_of("statement_timeout = '1ms'", "SELECT pg_sleep(0.2)")
    refused = database_error_of(
        "transaction_read_only = on", "UPDATE nexus_workflows_deferredwork SET last_error = 'Smith'"
    )
    assert describe_unavailable(cancelled) == "OperationalError: QueryCanceled"
    assert describe_unavailable(refused) == "InternalError: the database is read-only"


# --- 5. only attempts that started count ----------------------------------------------------


def test_a_claim_lost_before_prepare_started_costs_no_attempt(register_workflow: Any) -> None:
    runs: list[int] = []
    kind = register_workflow(lambda t, c, s: runs.append(1), retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    stale(work_id, attempt=1, started=False)  # the last allowed attempt, never started
    stats = run_once(kind)
    assert (stats.reclaimed, stats.done, stats.abandoned) == (1, 1, 0)
    assert runs == [1]
    work = row(work_id)
    assert (work.status, work.attempt, work.lost_unstarted) == (Status.DONE, 1, 1)
    assert work.history[-1] == {**work.history[-1], "outcome": "lost", "attempt": 1, "started": False}


def test_a_lost_attempt_is_in_the_history_before_the_work_runs_again(register_workflow: Any) -> None:
    seen: list[Any] = []
    kind = register_workflow(lambda t, c, s: seen.append(row(t["id"]).history), retry_schedule=[1, 1]).kind
    work_id = enqueue(kind, {"key": "a"})
    DeferredWork.objects.filter(pk=work_id).update(trigger={"key": "a", "id": int(work_id)})
    stale(work_id, attempt=0, started=True)
    run_once(kind)
    entries = [(entry["outcome"], entry["attempt"], entry["started"]) for entry in seen[0]]
    assert entries == [("lost", 0, True)]


def test_work_whose_claims_are_always_lost_before_starting_still_ends(register_workflow: Any) -> None:
    runs: list[int] = []
    kind = register_workflow(lambda t, c, s: runs.append(1), retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    stale(work_id, attempt=0, started=False, lost_unstarted=UNSTARTED_LOSSES_MAX - 1)
    stats = run_once(kind)
    assert (stats.reclaimed, stats.abandoned) == (1, 1)
    assert runs == []
    work = row(work_id)
    assert (work.status, work.attempt) == (Status.ABANDONED, 0)
    assert work.last_error.startswith(f"WorkerLost: {UNSTARTED_LOSSES_MAX} claims of this work were lost")


@override_settings(NEXUS_WORKFLOWS={"HEARTBEAT_INTERVAL": 5, "POLL_INTERVAL": 0.05})
def test_a_started_attempt_is_marked_soon_after_it_starts(register_workflow: Any) -> None:
    marked: list[Any] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        # Well before the first heartbeat (5 s): None if the marker waited for it.
        try:
            marked.append(wait_for(lambda: row(trigger["id"]).started_at, timeout=2, what="the start marker"))
        except AssertionError:
            marked.append(None)
        finally:
            connection.close()

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    DeferredWork.objects.filter(pk=work_id).update(trigger={"key": "a", "id": int(work_id)})
    run_once(kind)
    assert len(marked) == 1
    assert marked[0] is not None
    assert row(work_id).started_at is None  # the finished attempt left no marker


# --- 8. the crash-loop guard cannot orphan claims -------------------------------------------


def test_a_failing_guard_write_leaves_the_other_reclaimed_work_running(
    register_workflow: Any, write_blocker: Any, caplog: Any
) -> None:
    runs: list[str] = []
    kind = register_workflow(lambda t, c, s: runs.append(t["key"]), retry_schedule=[1]).kind
    doomed = enqueue(kind, {"key": "doomed"})
    others = [enqueue(kind, {"key": f"other-{n}"}) for n in range(3)]
    stale(doomed, attempt=2)  # beyond the schedule: the guard abandons it
    for work_id in others:
        stale(work_id, attempt=0)
    # The doomed row's heartbeat is the oldest, so the guard handles it first.
    DeferredWork.objects.filter(pk=doomed).update(heartbeat_at=timezone.now() - timedelta(days=1))
    write_blocker.install("NEW.dedupe_key = 'doomed' AND NEW.status = 'abandoned'")
    with (
        override_settings(NEXUS_WORKFLOWS=FAST),
        caplog.at_level(logging.ERROR, logger="nexus_workflows"),
        running(kind) as (_, thread),
    ):
        wait_for(
            lambda: all(row(work_id).status == Status.DONE for work_id in others),
            timeout=10,
            what="the other reclaimed items to run",
        )
        assert row(doomed).status == Status.PROCESSING
        assert thread.is_alive()
        write_blocker.remove()
        wait_for(lambda: row(doomed).status == Status.ABANDONED, timeout=10, what="the guard's retry")
    assert sorted(runs) == ["other-0", "other-1", "other-2"]  # the doomed item never ran
    assert f"{kind} #{doomed} attempt 2 of 2: writing its reclaim failed (" in caplog.text


def test_the_admin_history_says_which_losses_and_releases_were_not_counted(register_workflow: Any) -> None:
    from nexus_workflows.admin.display import history_rows

    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    DeferredWork.objects.filter(pk=work_id).update(
        history=[
            {"attempt": 0, "outcome": "lost", "started": False, "error": "x"},
            {"attempt": 0, "outcome": "lost", "started": True, "error": "x"},
            {"attempt": 1, "outcome": "released", "reason": "database unavailable", "error": "x"},
        ]
    )
    rows = history_rows(row(work_id))
    assert [(r.attempt, r.label, r.detail) for r in rows] == [
        ("1 of 2", "lost", "the runner stopped before this attempt started; not counted"),
        ("1 of 2", "lost", "the runner stopped heart-beating"),
        ("2 of 2", "released", "not counted: database unavailable"),
    ]

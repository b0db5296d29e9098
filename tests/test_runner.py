"""The deferred-work state machine, driven through the real runner (worker threads, real
database); the multi-process scenarios are in test_runworkflows_command.py."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

from nexus_workflows import ClaimLost, PermanentError, enqueue
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.limits import LAST_ERROR_MAX_LENGTH
from nexus_workflows.models import DeferredWork, Status
from tests.clock import make_due
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def run_once(*kinds: str, **options: Any) -> Any:
    return Runner(once=True, kinds=list(kinds) or None, install_signal_handlers=False, **options).run()


def row(work_id: str | int) -> DeferredWork:
    return DeferredWork.objects.get(pk=int(work_id))


class Upstream(Exception):
    pass


def test_success_marks_work_done_and_gives_up_the_claim(register_workflow: Any) -> None:
    seen: list[Any] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        seen.append((trigger, dict(checkpoints)))

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a", "n": 1})
    stats = run_once(kind)
    assert seen == [({"key": "a", "n": 1}, {})]
    work = row(work_id)
    assert work.status == Status.DONE
    assert (work.attempt, work.claimed_at, work.heartbeat_at) == (0, None, None)
    # The token stays, saying which claim made it done; no fence matches a done row.
    assert work.claim_token != ""
    assert not DeferredWork.objects.held(work.claim_token).exists()
    assert (stats.done, stats.rescheduled, stats.abandoned, stats.reclaimed) == (1, 0, 0, 0)


def test_failure_reschedules_along_the_schedule_then_abandons(register_workflow: Any) -> None:
    runs: list[int] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        runs.append(len(runs))
        raise Upstream(f"upstream down (run {len(runs)})")

    kind = register_workflow(prepare, retry_schedule=[2, 30]).kind
    work_id = enqueue(kind, {"key": "a"})

    before = timezone.now()
    assert run_once(kind).rescheduled == 1
    work = row(work_id)
    assert (work.status, work.attempt) == (Status.PENDING, 1)
    assert work.last_error == "Upstream: upstream down (run 1)"
    assert before + timedelta(minutes=2) <= work.next_attempt_at <= timezone.now() + timedelta(minutes=2)
    # The token of the claim that rescheduled it stays; no fence matches it (not processing).
    assert work.claim_token != ""
    assert not DeferredWork.objects.held(work.claim_token).exists()

    assert run_once(kind).done == 0  # not due yet: the schedule is respected
    assert len(runs) == 1

    make_due(work_id)
    before = timezone.now()
    run_once(kind)
    work = row(work_id)
    assert (work.status, work.attempt) == (Status.PENDING, 2)
    assert work.next_attempt_at >= before + timedelta(minutes=30)

    make_due(work_id)
    stats = run_once(kind)
    work = row(work_id)
    assert stats.abandoned == 1
    assert (work.status, work.attempt) == (Status.ABANDONED, 2)
    assert work.last_error == "Upstream: upstream down (run 3)"
    assert [entry["outcome"] for entry in work.history] == ["rescheduled", "rescheduled", "abandoned"]
    assert work.history[-1]["reason"] == "retry schedule exhausted"
    assert len(runs) == 3

    make_due(work_id)
    assert run_once(kind).done == 0  # abandoned work is never claimed
    assert len(runs) == 3


class TaggedPermanent(Exception):
    permanent = True


class TruthyButNotTrue(Exception):
    permanent = "yes"


@pytest.mark.parametrize(
    ("error", "abandoned"),
    [
        (PermanentError("HTTP 422 from upstream"), True),
        (TaggedPermanent("tagged"), True),
        (TruthyButNotTrue("only True counts"), False),
    ],
)
def test_permanent_errors_abandon_at_once(register_workflow: Any, error: Exception, abandoned: bool) -> None:
    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        raise error

    kind = register_workflow(prepare, retry_schedule=[1, 1, 1]).kind
    work_id = enqueue(kind, {"key": "a"})
    run_once(kind)
    work = row(work_id)
    if abandoned:
        assert (work.status, work.attempt) == (Status.ABANDONED, 0)
        assert work.history[-1]["reason"] == "permanent error"
    else:
        assert (work.status, work.attempt) == (Status.PENDING, 1)
    assert work.last_error == f"{type(error).__name__}: {error}"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot render")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (Unprintable(), "Unprintable: <the error's message could not be rendered>"),
        (ValueError(), "ValueError"),
        (ValueError("x" * 5000), None),
    ],
)
def test_last_error_is_type_and_message_bounded_and_safe(
    register_workflow: Any, error: Exception, expected: Any
) -> None:
    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        raise error

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    run_once(kind)
    work = row(work_id)
    assert work.status == Status.PENDING  # the bookkeeping itself did not fail
    if expected is None:
        assert work.last_error.startswith("ValueError: xxx")
        assert len(work.last_error) == LAST_ERROR_MAX_LENGTH
        assert work.last_error.endswith("…")
    else:
        assert work.last_error == expected


def test_a_retry_resumes_from_saved_checkpoints(register_workflow: Any) -> None:
    calls: list[str] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        if "record_id" not in checkpoints:
            calls.append("create record")
            save({"record_id": "rec42"})
        assert checkpoints["record_id"] == "rec42"
        if "notified" not in checkpoints:
            calls.append("notify")
            if len(calls) == 2:
                raise Upstream("notification service down")
            save({"notified": True})

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    run_once(kind)
    assert row(work_id).checkpoints == {"record_id": "rec42"}
    make_due(work_id)
    run_once(kind)
    work = row(work_id)
    assert work.status == Status.DONE
    assert work.checkpoints == {"record_id": "rec42", "notified": True}
    assert calls == ["create record", "notify", "notify"]  # the record was created once


def test_save_is_durable_before_it_returns(register_workflow: Any) -> None:
    observed: dict[str, Any] = {}

    def read_from_another_connection(work_id: int) -> Any:
        def read() -> None:
            try:
                observed["checkpoints"] = DeferredWork.objects.get(pk=work_id).checkpoints
            finally:
                connection.close()

        thread = threading.Thread(target=read)
        thread.start()
        thread.join()

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        save({"step": 1, "nested": {"ok": [1, 2]}})
        read_from_another_connection(trigger["id"])

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a", "id": None})
    DeferredWork.objects.filter(pk=work_id).update(trigger={"key": "a", "id": int(work_id)})
    run_once(kind)
    assert observed["checkpoints"] == {"step": 1, "nested": {"ok": [1, 2]}}


def test_a_bad_checkpoint_patch_fails_the_attempt_and_writes_nothing(register_workflow: Any) -> None:
    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        save({"when": timezone.now()})

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    run_once(kind)
    work = row(work_id)
    assert work.checkpoints == {}
    assert work.last_error.startswith("InvalidCheckpoint: save() takes JSON values only")


def test_async_prepare_runs_and_awaits_save(register_workflow: Any) -> None:
    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await save({"async": True})
        if trigger.get("fail"):
            raise Upstream("async failure")

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    ok_id = enqueue(kind, {"key": "ok"})
    failing_id = enqueue(kind, {"key": "fail", "fail": True})
    run_once(kind)
    assert (row(ok_id).status, row(ok_id).checkpoints) == (Status.DONE, {"async": True})
    assert row(failing_id).status == Status.PENDING
    assert row(failing_id).last_error == "Upstream: async failure"


def test_a_sync_prepare_returning_a_coroutine_is_a_failure_not_a_success(register_workflow: Any) -> None:
    async def body() -> None:
        pass

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> Any:
        return body()

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    run_once(kind)
    assert row(work_id).status == Status.PENDING
    assert "not an 'async def' function" in row(work_id).last_error


def stale(work_id: str, *, attempt: int, started: bool = True, lost_unstarted: int = 0) -> None:
    """Make the row look held by a runner that died (after its prepare started, or not)."""
    long_ago = timezone.now() - timedelta(hours=1)
    DeferredWork.objects.filter(pk=int(work_id)).update(
        status=Status.PROCESSING,
        claim_token="deadrunner",
        claimed_at=long_ago,
        heartbeat_at=long_ago,
        started_at=long_ago if started else None,
        attempt=attempt,
        lost_unstarted=lost_unstarted,
    )


def test_stale_work_is_reclaimed_as_a_new_attempt(register_workflow: Any) -> None:
    attempts: list[int] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        attempts.append(row(trigger["id"]).attempt)

    kind = register_workflow(prepare, retry_schedule=[1, 1]).kind
    work_id = enqueue(kind, {"key": "a"})
    DeferredWork.objects.filter(pk=work_id).update(trigger={"key": "a", "id": int(work_id)})
    stale(work_id, attempt=0)
    stats = run_once(kind)
    assert (stats.reclaimed, stats.done) == (1, 1)
    assert attempts == [1]
    work = row(work_id)
    assert work.status == Status.DONE
    assert work.history[-1]["outcome"] == "lost"


def test_a_fresh_heartbeat_is_not_reclaimed(register_workflow: Any) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    DeferredWork.objects.filter(pk=work_id).update(
        status=Status.PROCESSING, claim_token="liverunner", heartbeat_at=timezone.now()
    )
    stats = run_once(kind)
    assert stats.reclaimed == 0
    assert row(work_id).claim_token == "liverunner"


def test_crash_loop_guard_abandons_without_running(register_workflow: Any) -> None:
    runs: list[str] = []
    kind = register_workflow(lambda t, c, s: runs.append("ran"), retry_schedule=[1, 1]).kind
    work_id = enqueue(kind, {"key": "a"})
    stale(work_id, attempt=2)  # the last allowed attempt (0, 1, 2) died as well
    stats = run_once(kind)
    work = row(work_id)
    assert runs == []
    assert (stats.reclaimed, stats.abandoned) == (1, 1)
    assert (work.status, work.attempt) == (Status.ABANDONED, 3)
    assert work.last_error.startswith("WorkerLost:")
    assert [entry["outcome"] for entry in work.history] == ["lost", "abandoned"]


def test_runner_only_claims_its_kinds(register_workflow: Any) -> None:
    ran: list[str] = []
    mine = register_workflow(lambda t, c, s: ran.append("mine"), retry_schedule=[1]).kind
    other = register_workflow(lambda t, c, s: ran.append("other"), retry_schedule=[1]).kind
    mine_id = enqueue(mine, {"key": "a"})
    other_id = enqueue(other, {"key": "a"})
    DeferredWork.objects.create(kind="unregistered-kind", dedupe_key="a", trigger={})
    run_once(mine)
    assert ran == ["mine"]
    assert row(mine_id).status == Status.DONE
    assert row(other_id).status == Status.PENDING
    assert DeferredWork.objects.get(kind="unregistered-kind").status == Status.PENDING


def test_unknown_kind_for_the_runner_is_rejected(register_workflow: Any) -> None:
    from nexus_workflows.exceptions import UnknownWorkflow

    fire_and_forget = register_workflow(lambda trigger: None).kind
    with pytest.raises(UnknownWorkflow, match="no deferred workflow"):
        Runner(kinds=[fire_and_forget])


def test_once_drains_more_than_one_batch(register_workflow: Any) -> None:
    done: list[str] = []
    lock = threading.Lock()

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        with lock:
            done.append(trigger["key"])

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    for number in range(250):
        enqueue(kind, {"key": str(number)})
    with override_settings(NEXUS_WORKFLOWS={"BATCH_SIZE": 20}):
        stats = run_once(kind, concurrency=3)
    assert stats.done == 250
    assert sorted(done, key=int) == [str(n) for n in range(250)]
    assert DeferredWork.objects.filter(status=Status.DONE).count() == 250


def test_once_runs_what_was_due_when_an_attempt_ends_just_after_a_claim_without_room(
    register_workflow: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every thread busy, a turn claims nothing; an attempt that ended right then (its
    outcome handed over: nothing held) made --once stop with due work never run. Seen on
    MariaDB: runworkflows --once left the second of two tasks pending in 12 runs of 40.
    Here the turn's "no room" itself lets the attempt end, so the order is certain."""
    release = threading.Event()
    ran: list[str] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        if trigger["key"] == "first":
            release.wait(10)
        ran.append(trigger["key"])

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    for key in ("first", "second"):
        enqueue(kind, {"key": key})
    turn = Runner._turn

    def no_room_then_the_attempt_ends(self: Any, *args: Any) -> Any:
        claimed, more_due, purging = turn(self, *args)
        if not claimed and self._ledger.held_count() and not release.is_set():
            release.set()
            wait_for(lambda: self._ledger.running_count() == 0, timeout=10, what="the attempt to end")
        return claimed, more_due, purging

    monkeypatch.setattr(Runner, "_turn", no_room_then_the_attempt_ends)
    stats = run_once(kind, concurrency=1)
    assert release.is_set()  # the interleaving happened
    assert (ran, stats.done) == (["first", "second"], 2)


@pytest.mark.parametrize("window", ["the kind's", "per key"])
def test_once_runs_work_a_rate_limit_holds_back_once_its_window_slides(
    register_workflow: Any, window: str
) -> None:
    """--once ran the first window's two starts, then found the window full, claimed
    nothing and stopped: "2 done", with four due items left pending."""
    flow: dict[str, Any] = {"rate_limit": (2, 0.5)}
    if window == "per key":
        flow["rate_key"] = lambda trigger: "one sender"
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1], **flow).kind
    for number in range(6):
        enqueue(kind, {"key": str(number)})
    started = time.monotonic()
    stats = run_once(kind)
    assert stats.done == 6
    assert DeferredWork.objects.filter(kind=kind, status=Status.DONE).count() == 6
    assert time.monotonic() - started >= 1.0  # three windows of 0.5 s: the limit held


@pytest.mark.parametrize("window", ["the kind's", "per key"])
def test_once_reclaims_stale_work_a_rate_limit_holds_back_once_its_window_slides(
    register_workflow: Any, window: str
) -> None:
    """--once reclaimed the first window's starts, then found the window full for the
    rest of the stale rows and stopped (as it did for due work before), leaving them
    stale."""
    flow: dict[str, Any] = {"rate_limit": (2, 0.5)}
    if window == "per key":
        flow["rate_key"] = lambda trigger: "one sender"
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1, 1], **flow).kind
    ids = [enqueue(kind, {"key": str(number)}) for number in range(5)]
    for work_id in ids:
        stale(work_id, attempt=0)
    stats = run_once(kind)
    assert (stats.reclaimed, stats.done) == (5, 5)
    assert DeferredWork.objects.filter(kind=kind, status=Status.DONE).count() == 5


def test_logs_name_kind_id_attempt_and_outcome_but_no_contents(register_workflow: Any, caplog: Any) -> None:
    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        save({"phone": "+52 55 1234 5678"})
        raise Upstream(f"patient {trigger['name']} not found")

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a", "name": "María López"})
    with caplog.at_level(logging.DEBUG, logger="nexus_workflows"):
        run_once(kind)
    assert f"{kind} #{work_id} attempt 1 of 2: failed (Upstream); attempt 2 of 2 in 60s" in caplog.text
    assert "María" not in caplog.text
    assert "5678" not in caplog.text
    assert "María López" in row(work_id).last_error  # the full error stays in the database


# Seconds without a heartbeat after which these tests take a claim as stale: the stop and
# the checks after it must fit in it, with room for a loaded machine's stalls.
STALE = 3.0


@override_settings(
    NEXUS_WORKFLOWS={
        "SHUTDOWN_GRACE": 0.3,
        "POLL_INTERVAL": 0.05,
        "HEARTBEAT_INTERVAL": 0.2,
        "STALE_AFTER": STALE,
    }
)
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_shutdown_keeps_the_claim_of_an_attempt_that_outlives_the_grace(
    register_workflow: Any, mode: str
) -> None:
    """Never two executions at once: the claim of an attempt still running when the grace
    ends is neither released nor refreshed, so nobody can take it until it goes stale."""
    started = threading.Event()
    finish = threading.Event()
    late_save: dict[str, Any] = {}

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        started.set()
        finish.wait(10)
        try:
            save({"late": True})
            late_save["saved"] = True
        except ClaimLost as error:
            late_save["error"] = error
            raise

    async def async_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        started.set()
        deadline = time.monotonic() + 10
        while not finish.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        try:
            await save({"late": True})
            late_save["saved"] = True
        except ClaimLost as error:
            late_save["error"] = error
            raise

    kind = register_workflow(prepare if mode == "sync" else async_prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
    thread = threading.Thread(target=runner.run)
    thread.start()
    assert started.wait(10)
    wait_for(lambda: row(work_id).started_at is not None, timeout=5, what="the start marker")
    runner.request_stop()
    thread.join(10)
    assert not thread.is_alive()
    work = row(work_id)
    assert (work.status, work.attempt) == (Status.PROCESSING, 0)
    assert work.claim_token != ""
    assert runner.stats.released == 0
    claimer = Claimer(kinds=[kind], using="default")
    assert claimer.claim_stale(10, stale_after=timedelta(seconds=STALE)) == []  # still fresh
    finish.set()
    wait_for(lambda: late_save, timeout=5, what="the late save")
    assert late_save == {"saved": True}  # nobody took the claim while the attempt ran
    assert row(work_id).checkpoints == {"late": True}
    heartbeat_before = row(work_id).heartbeat_at
    # Heartbeats stopped with the runner: the claim goes stale (by the database's clock),
    # its heartbeat untouched meanwhile.
    stale_claim = DeferredWork.objects.filter(pk=work_id, heartbeat_at__lt=Now() - timedelta(seconds=STALE))
    wait_for(stale_claim.exists, timeout=10 + STALE, what="the claim to go stale")
    assert row(work_id).heartbeat_at == heartbeat_before
    (reclaimed,) = claimer.claim_stale(10, stale_after=timedelta(seconds=STALE))
    assert reclaimed.attempt == 1  # the attempt had started, so it counts
    lost = reclaimed.history[-1]
    assert (lost["outcome"], lost["attempt"], lost["started"]) == ("lost", 0, True)


@override_settings(NEXUS_WORKFLOWS={"HEARTBEAT_INTERVAL": 0.2, "STALE_AFTER": STALE, "POLL_INTERVAL": 0.05})
def test_heartbeats_keep_slow_work_from_being_reclaimed(register_workflow: Any) -> None:
    reclaimed: list[Any] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        deadline = time.monotonic() + 2 * STALE + 0.5  # more than twice STALE_AFTER
        while time.monotonic() < deadline:
            try:
                reclaimed.extend(
                    Claimer(kinds=[trigger["kind"]], using="default").claim_stale(
                        10, stale_after=timedelta(seconds=STALE)
                    )
                )
            finally:
                connection.close()
            time.sleep(0.1)

    workflow = register_workflow(prepare, retry_schedule=[1])
    work_id = enqueue(workflow.kind, {"key": "a", "kind": workflow.kind})
    stats = run_once(workflow.kind, concurrency=1)
    assert reclaimed == []
    assert stats.done == 1
    assert row(work_id).attempt == 0


def behind_the_test_pooler() -> bool:
    """True in bin/test's PgBouncer leg: "default" goes through the pooler, "direct" not."""
    from django.db import connections

    if connection.vendor != "postgresql":
        return False
    direct = connections["direct"].settings_dict
    return (direct["HOST"], direct["PORT"]) != (
        connection.settings_dict["HOST"],
        connection.settings_dict["PORT"],
    )


@override_settings(NEXUS_WORKFLOWS={"POLL_INTERVAL": 5, "WAKEUP_FALLBACK_POLL_INTERVAL": 0.1})
def test_the_runner_knows_and_logs_its_wakeup_mode(register_workflow: Any, caplog: Any) -> None:
    from nexus_workflows.deferred.wakeup import WakeupMode

    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
    thread = threading.Thread(target=runner.run)
    with caplog.at_level(logging.INFO, logger="nexus_workflows"):
        thread.start()
        try:
            wait_for(lambda: "runner started" in caplog.text, timeout=15, what="the start line")
            if connection.vendor != "postgresql":
                expected, interval = WakeupMode.POLL, 5
            elif behind_the_test_pooler():  # LISTEN through the pooler: its probe is lost
                expected, interval = WakeupMode.SHORT_POLL, 0.1
            else:
                expected, interval = WakeupMode.LISTENING, 5
            assert runner.wakeup_mode == expected
            assert f"wake-ups: {expected}" in caplog.text
            # Listening, it sleeps the long interval once its listener holds the waiting lock
            # (taken after its first claim found nothing).
            wait_for(lambda: runner.idle_interval() == interval, timeout=10, what="the idle interval")
        finally:
            runner.request_stop(now=True)
            thread.join(15)
    assert not thread.is_alive()
    assert Runner(once=True, kinds=[kind], install_signal_handlers=False).wakeup_mode == WakeupMode.POLL


def test_a_stop_request_starts_no_claimed_work_the_main_loop_has_not_released_yet(
    register_workflow: Any,
) -> None:
    """SIGTERM's thread asks the runner to stop while its main loop may be busy (a claim, a
    purge batch, an outage's back-off) before it releases what is claimed but not started;
    a worker thread that frees up meanwhile must not start queued work (the README: claimed
    work not yet started is released). Here the loop never runs: the stop request alone
    must hold the queue, and the release still gets the work."""
    from nexus_workflows.deferred.runner.ledger import SYNC
    from tests.runner.helpers import work

    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
    queued = work(kind=kind)
    runner._ledger.dispatch([queued])
    runner.request_stop()
    assert runner._ledger.take_now(SYNC, 1) == []  # a free worker starts nothing now
    assert runner._ledger.close() == [queued]  # the shutdown releases it

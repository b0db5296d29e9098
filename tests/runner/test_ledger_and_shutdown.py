"""What a runner holds, and the order in which it lets go of it when stopping."""

from __future__ import annotations

import threading
from collections.abc import Callable

from nexus_workflows.deferred.runner.ledger import Ledger, Pending
from nexus_workflows.deferred.runner.shutdown import Shutdown
from nexus_workflows.deferred.transitions import ClaimedWork
from tests.runner.helpers import FakeClock, outcome, work


def test_free_slots_count_queued_and_running_work() -> None:
    ledger = Ledger()
    ledger.dispatch([work(), work(), work()])
    assert ledger.free_slots(4) == 1
    taken = ledger.take()
    assert taken is not None
    assert (ledger.free_slots(4), ledger.running_count()) == (1, 1)
    assert ledger.unmarked() == [taken]  # its start marker is not written yet
    ledger.finished(taken)
    assert (ledger.free_slots(4), ledger.running_count(), ledger.unmarked()) == (2, 0, [])


def test_a_closed_ledger_hands_out_nothing_and_returns_what_never_started() -> None:
    ledger = Ledger()
    queued, reclaimed = work(), work(reclaimed=True)
    ledger.dispatch([queued])
    ledger.add_unguarded([reclaimed])
    empty = Ledger()
    waiting: list[ClaimedWork | None] = []
    worker = threading.Thread(target=lambda: waiting.append(empty.take()))
    worker.start()
    assert empty.close() == []
    worker.join(5)
    assert waiting == [None]  # a blocked worker is let go
    assert ledger.close() == [queued]  # the reclaimed one waits for its guard
    assert ledger.take_unguarded() == [reclaimed]
    assert ledger.take() is None
    assert ledger.held_count() == 0


def test_queued_work_starts_only_while_its_claim_was_confirmed_recently() -> None:
    clock = FakeClock()
    ledger = Ledger(at_risk=lambda unconfirmed_for: unconfirmed_for > 10, clock=clock)
    kept, lost, late = work(), work(), work()
    ledger.dispatch([kept, lost])
    clock.advance(8)
    ledger.confirm(clock.now - 1)  # a heartbeat begun 7 s after the claim found them held
    assert ledger.take() is kept
    clock.advance(4)  # 11 s since the claim, 4 s since the heartbeat: kept would start
    ledger.dispatch([late])
    clock.advance(11)  # nothing confirmed either since: both at risk
    assert ledger.take_now("sync", 5) == []
    assert ledger.take_forfeited() == [lost, late]
    assert ledger.take_forfeited() == []
    assert ledger.held() == [kept]  # forfeited claims are not heart-beaten any more


def test_a_heartbeat_after_the_risk_does_not_rescue_a_queued_claim() -> None:
    """Another runner may have reclaimed it before that heartbeat, which then simply did
    not match it; the heartbeat gives it up at once."""
    clock = FakeClock()
    ledger = Ledger(at_risk=lambda unconfirmed_for: unconfirmed_for > 10, clock=clock)
    risky, fresh = work(), work()
    ledger.dispatch([risky])
    clock.advance(9)
    ledger.dispatch([fresh])
    clock.advance(3)
    ledger.confirm(clock.now)
    assert ledger.take_forfeited() == [risky]
    clock.advance(9)  # 9 s since the heartbeat confirmed the fresh one
    assert ledger.take() is fresh


def test_a_heartbeat_confirms_only_the_claims_it_refreshed() -> None:
    """A queued claim the beat did not refresh (another session held its row's lock, or
    another runner took it: the fenced beat matched nothing) keeps its last confirmation
    and is forfeited once that is at risk, never started. The old beat confirmed every
    queued claim, whatever its statement matched."""
    clock = FakeClock()
    ledger = Ledger(at_risk=lambda unconfirmed_for: unconfirmed_for > 10, clock=clock)
    refreshed, skipped = work(), work()
    ledger.dispatch([refreshed, skipped])
    clock.advance(8)
    ledger.confirm(clock.now, {refreshed.id})
    clock.advance(4)  # 12 s since the claim, 4 s since the beat that refreshed one of them
    ledger.confirm(clock.now, {refreshed.id})
    assert ledger.take_forfeited() == [skipped]
    assert ledger.take() is refreshed


class Recorder:
    """The parts a stop drives, recording what they were asked, in order."""

    def __init__(self, ledger: Ledger, clock: FakeClock, *, finishes_after: float | None) -> None:
        self.ledger = ledger
        self.clock = clock
        self.finishes_after = finishes_after
        self.calls: list[tuple[str, object]] = []
        self.running = ledger.take()

    def release(self, works: list[ClaimedWork], time_is_up: Callable[[], bool]) -> None:
        self.calls.append(("release", [w.id for w in works]))

    def write_outcomes(self) -> bool:
        self.clock.advance(0.5)
        due = self.finishes_after is not None and self.clock.now >= self.finishes_after
        if self.running is not None and due:
            self.ledger.finished(self.running)
            self.calls.append(("finished", self.running.id))
            self.running = None
        return True

    def stop_helpers(self) -> None:
        self.calls.append(("stop helpers", self.ledger.running_count()))


def stop(ledger: Ledger, recorder: Recorder, clock: FakeClock, *, now: bool = False) -> None:
    stop_now = threading.Event()
    if now:
        stop_now.set()
    Shutdown(
        ledger,
        grace=3.0,
        stale_after=30.0,
        stop_now=stop_now,
        wake=threading.Event(),
        release=recorder.release,
        write_outcomes=recorder.write_outcomes,
        stop_helpers=recorder.stop_helpers,
        monotonic=clock,
    ).run()


def test_unstarted_work_is_released_first_and_running_work_gets_the_grace() -> None:
    ledger, clock = Ledger(), FakeClock()
    running, queued = work(), work()
    ledger.dispatch([running, queued])
    recorder = Recorder(ledger, clock, finishes_after=clock.now + 2.0)
    stop(ledger, recorder, clock)
    assert recorder.calls == [("release", [queued.id]), ("finished", running.id), ("stop helpers", 0)]


def test_reclaimed_work_its_guard_has_not_checked_is_not_released() -> None:
    """Released, it would be pending again and run by a plain claim past its retry
    schedule; left stale, the next reclaim checks it."""
    ledger, clock = Ledger(), FakeClock()
    running, queued, reclaimed = work(), work(), work(reclaimed=True)
    ledger.dispatch([running, queued])
    ledger.add_unguarded([reclaimed])
    recorder = Recorder(ledger, clock, finishes_after=clock.now + 1.0)
    stop(ledger, recorder, clock)
    assert recorder.calls == [("release", [queued.id]), ("finished", running.id), ("stop helpers", 0)]
    assert ledger.held() == []


def test_an_attempt_outliving_the_grace_keeps_its_claim() -> None:
    ledger, clock = Ledger(), FakeClock()
    running = work()
    ledger.dispatch([running])
    recorder = Recorder(ledger, clock, finishes_after=None)
    stop(ledger, recorder, clock)
    # Never released: another runner may take it only once it goes stale.
    assert recorder.calls == [("stop helpers", 1)]
    assert ledger.held() == [running]


def test_stop_now_gives_no_grace() -> None:
    ledger, clock = Ledger(), FakeClock()
    ledger.dispatch([work()])
    recorder = Recorder(ledger, clock, finishes_after=clock.now + 1.0)
    started = clock.now
    stop(ledger, recorder, clock, now=True)
    assert recorder.calls == [("stop helpers", 1)]
    assert clock.now - started <= 0.5  # one flush of finished outcomes, no waiting


def test_outcomes_that_keep_failing_are_flushed_for_a_bounded_time() -> None:
    ledger, clock = Ledger(), FakeClock()
    ledger.add_unwritten(Pending(outcome()))
    attempts = []

    def never_written() -> bool:
        attempts.append(clock.now)
        clock.advance(1.0)
        return False

    Shutdown(
        ledger,
        grace=3.0,
        stale_after=30.0,
        stop_now=threading.Event(),
        wake=threading.Event(),
        release=lambda works, deadline: None,
        write_outcomes=never_written,
        stop_helpers=lambda: None,
        monotonic=clock,
    ).run()
    # Tries for min(grace, 5) = 3 s past the stop (1 s each here), then exits.
    assert attempts == [1000.0, 1001.0, 1002.0]


def test_a_second_signal_ends_a_flush_that_waits_out_an_outage() -> None:
    """The grace ends when the second signal comes: the flush of outcomes that cannot be
    written goes on only for the min(grace, 5) s every stop allows, not the whole grace."""
    ledger, clock = Ledger(), FakeClock()
    ledger.add_unwritten(Pending(outcome()))
    stop_now = threading.Event()
    attempts = []

    def never_written() -> bool:
        attempts.append(clock.now)
        if len(attempts) == 8:
            stop_now.set()  # the second SIGTERM, 7 s into a grace of 30
        clock.advance(1.0)
        return False

    Shutdown(
        ledger,
        grace=30.0,
        stale_after=60.0,
        stop_now=stop_now,
        wake=threading.Event(),
        release=lambda works, time_is_up: None,
        write_outcomes=never_written,
        stop_helpers=lambda: None,
        monotonic=clock,
    ).run()
    assert attempts == [1000.0 + second for second in range(8)]


def test_a_second_signal_ends_the_release_of_unstarted_claims() -> None:
    """Releasing retries through an outage until the grace ends, or the second signal."""
    ledger, clock = Ledger(), FakeClock()
    ledger.dispatch([work()])
    stop_now = threading.Event()
    tries = []

    def release(works: list[ClaimedWork], time_is_up: Callable[[], bool]) -> None:
        while not time_is_up():  # the database refuses every try
            tries.append(clock.now)
            if len(tries) == 5:
                stop_now.set()
            clock.advance(0.2)

    Shutdown(
        ledger,
        grace=30.0,
        stale_after=60.0,
        stop_now=stop_now,
        wake=threading.Event(),
        release=release,
        write_outcomes=lambda: True,
        stop_helpers=lambda: None,
        monotonic=clock,
    ).run()
    assert len(tries) == 5


def test_claimed_work_never_shows_its_data_in_its_repr() -> None:
    """An error tracker that prints locals, or a debug log line, may show it."""
    claimed = work(
        dedupe_key="+5215512345678",
        trigger={"patient": "María López"},
        checkpoints={"summary": "María"},
        history=[{"error": "ValueError: María"}],
        return_value="María",
        error_record={"traceback": "María"},
        columns={"worker_ids": ["María"]},
    )
    shown = repr(claimed)
    assert "María" not in shown
    assert "5512345678" not in shown
    assert f"id={claimed.id}" in shown
    assert "kind='unit'" in shown


def test_a_held_ledger_starts_nothing_queued_and_close_still_returns_it() -> None:
    ledger = Ledger()
    queued = work()
    ledger.dispatch([queued])
    ledger.hold()
    assert ledger.take_now("sync", 5) == []
    assert ledger.wait_sync_taken(0.01)  # the main loop does not wait for a hand-off now
    taken: list[ClaimedWork | None] = []
    worker = threading.Thread(target=lambda: taken.append(ledger.take()))
    worker.start()
    worker.join(0.2)
    assert worker.is_alive()  # held: the worker waits, it does not start the queued work
    assert taken == []
    assert ledger.close() == [queued]
    worker.join(5)
    assert taken == [None]

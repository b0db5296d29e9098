"""Sync and async work held apart: each lane's free slots count only its own work."""

from __future__ import annotations

from typing import Any

from nexus_workflows.deferred.runner.ledger import ASYNC, SYNC, Ledger
from nexus_workflows.deferred.transitions import ClaimedWork
from tests.runner.helpers import FakeClock, work


def by_kind(item: Any) -> str:
    return ASYNC if item.kind == "async" else SYNC


def test_each_lane_counts_only_its_own_queued_and_running_work() -> None:
    ledger = Ledger(by_kind)
    lanes = ledger.dispatch([work(kind="sync"), work(kind="async"), work(kind="async")])
    assert lanes == {SYNC, ASYNC}
    assert (ledger.free_slots(4, SYNC), ledger.free_slots(4, ASYNC)) == (3, 2)
    started = ledger.take_now(ASYNC, 1)
    assert [item.kind for item in started] == ["async"]
    assert (ledger.free_slots(4, ASYNC), ledger.running_count()) == (2, 1)
    assert ledger.held_count(ASYNC) == 2
    assert ledger.held_count(SYNC) == 1
    assert ledger.held_count() == 3


def test_sync_workers_never_take_async_work_nor_the_loop_sync_work() -> None:
    ledger = Ledger(by_kind)
    ledger.dispatch([work(kind="async"), work(kind="sync")])
    taken = ledger.take()
    assert taken is not None
    assert taken.kind == "sync"
    assert ledger.take_now(SYNC, 5) == []
    assert [item.kind for item in ledger.take_now(ASYNC, 5)] == ["async"]


def test_the_loop_takes_no_more_than_its_free_slots_and_nothing_once_closed() -> None:
    ledger = Ledger(by_kind)
    ledger.dispatch([work(kind="async") for _ in range(5)])
    assert len(ledger.take_now(ASYNC, 3)) == 3
    unstarted = ledger.close()
    assert len(unstarted) == 2
    assert ledger.take_now(ASYNC, 5) == []
    assert ledger.running_count() == 3  # still running: their claims are kept


def named(lane: str, name: str, *, limited: bool = False) -> ClaimedWork:
    return work(kind=lane, dedupe_key=name, limited=limited)


def names(works: list[ClaimedWork | None]) -> list[str]:
    return [item.dedupe_key for item in works if item is not None]


def test_limited_work_is_handed_out_before_queued_plain_work_in_either_lane() -> None:
    # Claimed limited work holds its slot, key or reserved start while it waits: it must
    # not wait behind a prefetch of plain work claimed before it.
    ledger = Ledger(by_kind)
    ledger.dispatch([named("sync", "plain-1"), named("sync", "plain-2"), named("async", "plain")])
    ledger.dispatch([named("sync", "limited-1", limited=True), named("async", "limited", limited=True)])
    ledger.dispatch([named("sync", "limited-2", limited=True)])
    assert names([ledger.take() for _ in range(4)]) == ["limited-1", "limited-2", "plain-1", "plain-2"]
    assert names(list(ledger.take_now(ASYNC, 2))) == ["limited", "plain"]


def test_a_heartbeat_keeps_limited_work_first_and_a_close_returns_all_of_it() -> None:
    clock = FakeClock()
    ledger = Ledger(by_kind, at_risk=lambda unconfirmed_for: unconfirmed_for > 10, clock=clock)
    ledger.dispatch([named("sync", "plain-1"), named("sync", "limited-1", limited=True)])
    clock.advance(5)
    ledger.dispatch([named("sync", "plain-2"), named("sync", "limited-2", limited=True)])
    clock.advance(6)  # the first two are at risk now, the others not
    ledger.confirm(clock())
    assert names(ledger.take_forfeited()) == ["limited-1", "plain-1"]
    ledger.dispatch([named("sync", "limited-3", limited=True)])
    first = ledger.take()
    assert names([first]) == ["limited-2"]
    assert names(ledger.close()) == ["limited-3", "plain-2"]


def test_limited_room_counts_free_slots_and_slots_about_to_end_other_work() -> None:
    ledger = Ledger(by_kind)
    assert ledger.limited_room(4, 0) == 4  # all free
    # A prefetch of other work: the old free-slot count is negative, yet limited work
    # goes first and starts as soon as a slot ends its current attempt.
    ledger.dispatch([named("sync", f"plain-{n}") for n in range(20)])
    ledger.take_now(SYNC, 4)
    assert ledger.free_slots(4) == -16
    assert ledger.limited_room(4, 0) == 0  # slow work: no slot is about to be free
    assert ledger.limited_room(4, 2) == 2  # two slots end their attempts within moments
    assert ledger.limited_room(4, 100) == 4
    # Limited work queued or running takes its slots: those never count as about to end.
    ledger.dispatch([named("sync", "limited-1", limited=True)])
    assert ledger.limited_room(4, 100) == 3
    (started,) = ledger.take_now(SYNC, 1)
    assert started.limited
    ledger.dispatch([named("sync", "limited-2", limited=True)])
    assert ledger.limited_room(4, 100) == 2
    ledger.finished(started)
    assert ledger.limited_room(4, 100) == 3
    # Each lane its own: the async lane's slots are no room for sync work.
    assert ledger.limited_room(100, 0, ASYNC) == 100
    assert ledger.limited_room(4, 0, SYNC) == 0

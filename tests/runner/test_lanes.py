"""Sync and async work held apart: each lane's free slots count only its own work."""

from __future__ import annotations

from typing import Any

from nexus_workflows.deferred.runner.ledger import ASYNC, SYNC, Ledger
from tests.runner.helpers import work


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

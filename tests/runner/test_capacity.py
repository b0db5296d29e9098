"""How much a runner claims: its slots, plus a prefetch of quick work only."""

from __future__ import annotations

from nexus_workflows.deferred.runner.capacity import Capacity


def test_before_any_attempt_finished_a_runner_holds_one_item_per_slot() -> None:
    capacity = Capacity(concurrency=4, batch_size=100)
    assert capacity.bounds() == (4, 4)
    assert capacity.wants_more(held=3)
    assert not capacity.wants_more(held=4)
    assert capacity.claim_limit(held=1) == 3


def test_quick_work_is_prefetched_up_to_the_batch_size() -> None:
    capacity = Capacity(concurrency=4, batch_size=100)
    capacity.observe(0.001)  # 50 ms of work per slot = 50 items per slot, capped at 100
    assert capacity.bounds() == (104, 54)
    # Refill only once down to the low-water mark, so claims come in batches.
    assert not capacity.wants_more(held=60)
    assert capacity.wants_more(held=54)
    assert capacity.claim_limit(held=54) == 50


def test_slow_work_is_not_prefetched() -> None:
    capacity = Capacity(concurrency=8, batch_size=100)
    capacity.observe(0.2)
    assert capacity.bounds() == (10, 9)  # 0.05 s / 0.2 s per slot: 2 more for 8 slots
    capacity.observe(5.0)
    capacity.observe(5.0)
    assert capacity.bounds() == (8, 8)


def test_the_average_moves_a_fifth_of_the_way_per_attempt() -> None:
    capacity = Capacity(concurrency=1, batch_size=10)
    capacity.observe(1.0)
    capacity.observe(2.0)
    assert capacity.average_runtime == 1.2


def test_one_claim_takes_at_most_a_batch_or_the_concurrency() -> None:
    capacity = Capacity(concurrency=500, batch_size=100)
    assert capacity.claim_limit(held=0) == 500
    capacity = Capacity(concurrency=2, batch_size=100)
    capacity.observe(0.0)
    assert capacity.claim_limit(held=0) == 100


def test_the_slots_finish_as_many_attempts_within_the_prefetch_window_as_the_average_says() -> None:
    # How many busy slots a limited item may be claimed for (Ledger.limited_room): it is
    # handed out first, so it waits only for the first of them to end its attempt.
    capacity = Capacity(concurrency=64, batch_size=100)
    assert capacity.finishing_soon() == 0  # nothing timed yet: only free slots count
    capacity.observe(1.0)
    assert capacity.finishing_soon() == 3  # 64 slots x 50 ms / 1 s
    assert capacity.bounds() == (67, 65)
    capacity = Capacity(concurrency=4, batch_size=100)
    capacity.observe(0.0005)
    assert capacity.finishing_soon() == 400  # not capped by the batch, as the prefetch is
    assert capacity.bounds() == (104, 54)

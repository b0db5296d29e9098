"""The purge's batch size: sized to a time budget, halved by cancels (``statement_timeout``);
pure bookkeeping."""

from __future__ import annotations

from nexus_workflows.deferred.purge_batches import FIRST_SIZE, GROW_AFTER, PurgeBatchSize, rows

# Seconds a batch may take, for the tests where only a statement_timeout should limit it.
ROOMY = 60.0


def at_full_size(maximum: int, target: float = ROOMY) -> PurgeBatchSize:
    """A size that ramped up to ``maximum`` on instant batches."""
    sizes = PurgeBatchSize(maximum, target)
    while sizes.size < maximum:
        assert sizes.completed(sizes.size, 0.0001)
    return sizes


def test_the_first_batch_is_small_and_never_below_one_row() -> None:
    assert PurgeBatchSize(1000, 0.5).size == FIRST_SIZE == 10
    assert PurgeBatchSize(3, 0.5).size == 3
    assert PurgeBatchSize(0, 0.5).size == 1


def test_quick_batches_ramp_up_at_most_tenfold_a_batch_up_to_the_maximum() -> None:
    """Plain rows: 10 in 2 ms, 100 in 5 ms; the size reaches PURGE_BATCH_SIZE in two batches."""
    sizes = PurgeBatchSize(1000, 0.5)
    assert sizes.completed(10, 0.002) is True
    assert sizes.size == 100
    sizes.completed(100, 0.005)
    assert sizes.size == 1000
    assert not any(sizes.completed(1000, 0.03) for _ in range(GROW_AFTER * 2))  # at the maximum
    assert sizes.size == 1000


def test_the_ramp_aims_at_three_quarters_of_the_budget_and_ends_there() -> None:
    """Slow rows (5 ms each): 10 take 50 ms, so 75 should take 0.375 s of the 0.5 s budget."""
    sizes = PurgeBatchSize(1000, 0.5)
    sizes.completed(10, 0.05)
    assert sizes.size == 75
    assert sizes.completed(75, 0.38) is False  # between half the budget and all of it: it fits
    # The ramp is over: a quick batch now counts toward GROW_AFTER, no more.
    assert [sizes.completed(75, 0.1) for _ in range(GROW_AFTER)] == [False] * (GROW_AFTER - 1) + [True]
    assert sizes.size == 150


def test_a_full_batch_over_the_budget_shrinks_the_next_in_proportion() -> None:
    """A table turned slow: 1,000 rows took 5.2 s, so 72 take 0.375 s."""
    sizes = at_full_size(1000, 0.5)
    assert sizes.completed(1000, 5.2) is True
    assert sizes.size == 72
    assert sizes.completed(72, 0.6) is True  # still over: smaller again
    assert sizes.size == 45
    assert sizes.completed(45, 0.01) is False  # quick, but the ramp is over: one of GROW_AFTER


def test_one_row_over_the_budget_stays_one_row() -> None:
    sizes = PurgeBatchSize(1, 0.5)
    assert sizes.completed(1, 3.0) is False
    assert sizes.size == 1


def test_batches_between_half_the_budget_and_the_budget_keep_the_size() -> None:
    sizes = at_full_size(1000, 0.5)
    sizes.completed(1000, 1.0)
    assert sizes.size == 375
    assert not any(sizes.completed(375, seconds) for seconds in (0.25, 0.3, 0.4, 0.5) * 5)
    assert sizes.size == 375


def test_a_cancel_halves_the_size_down_to_one_row() -> None:
    sizes = at_full_size(1000)
    seen = []
    while sizes.cancelled(2.0, None):
        seen.append(sizes.size)
    assert seen == [500, 250, 125, 62, 31, 15, 7, 3, 1]
    assert sizes.cancelled(2.0, None) is False  # one row cancelled: nothing smaller to try
    assert sizes.size == 1


def test_quick_full_batches_double_the_size_back_to_the_maximum() -> None:
    sizes = at_full_size(1000)
    sizes.cancelled(2.0, None)
    sizes.cancelled(2.0, None)
    assert sizes.size == 250
    grew = [sizes.completed(250, 0.4) for _ in range(GROW_AFTER)]  # each under 2.0 / 4
    assert grew == [False] * (GROW_AFTER - 1) + [True]
    assert sizes.size == 500
    for _ in range(GROW_AFTER):
        sizes.completed(500, 0.4)
    assert sizes.size == 1000


def test_growth_stops_at_the_maximum_even_when_it_is_no_power_of_two() -> None:
    sizes = at_full_size(300)
    sizes.cancelled(1.0, None)
    assert sizes.size == 150
    for _ in range(GROW_AFTER):
        sizes.completed(150, 0.01)
    assert sizes.size == 300


def test_after_a_cancel_batches_over_half_the_timeout_shrink_and_under_it_keep_the_size() -> None:
    """A batch of 500 that takes 2.6 s under a 3.5 s timeout must not double: the batch of
    1000 would be cancelled every few turns. Over half the timeout it shrinks, so the next
    batches stay clear of it; between a quarter and a half of it, it stays."""
    sizes = at_full_size(1000)
    sizes.cancelled(3.5, None)
    assert sizes.budget == 1.75
    assert not any(sizes.completed(500, seconds) for seconds in (1.0, 3.5 / 4, 1.75) * 5)
    assert sizes.size == 500
    assert sizes.completed(500, 2.6) is True
    assert sizes.size == 252


def test_a_slow_batch_or_a_cancel_restarts_the_count_of_quick_ones() -> None:
    sizes = at_full_size(1000)
    sizes.cancelled(2.0, None)
    for _ in range(GROW_AFTER - 1):
        sizes.completed(500, 0.1)
    sizes.completed(500, 0.6)  # not quick: the count starts again
    for _ in range(GROW_AFTER - 1):
        assert sizes.completed(500, 0.1) is False
    assert sizes.completed(500, 0.1) is True
    sizes.cancelled(2.0, None)
    for _ in range(GROW_AFTER - 1):
        sizes.completed(500, 0.1)
    assert sizes.cancelled(2.0, None) is True  # before the last quick one
    assert sizes.size == 250
    for _ in range(GROW_AFTER - 1):
        assert sizes.completed(250, 0.1) is False


def test_a_partial_batch_says_nothing_about_a_full_one() -> None:
    sizes = at_full_size(1000)
    sizes.cancelled(2.0, None)
    for _ in range(GROW_AFTER - 1):
        sizes.completed(500, 0.1)
    assert sizes.completed(499, 1.9) is False  # the last of a purge: neither quick nor slow
    assert sizes.completed(0, 0.0) is False
    assert sizes.completed(500, 0.1) is True
    fresh = PurgeBatchSize(1000, 0.5)
    assert fresh.completed(3, 30.0) is False  # not even over the budget
    assert fresh.size == FIRST_SIZE


def test_without_the_timeout_the_longest_cancel_is_the_yardstick() -> None:
    """Where the session's statement_timeout cannot be read (None), the longest a
    cancelled batch ran stands for it: a cancel by hand must not make it look shorter."""
    sizes = at_full_size(1000)
    sizes.cancelled(4.0, None)
    sizes.cancelled(0.2, None)  # someone cancelled a batch by hand
    assert (sizes.size, sizes.budget) == (250, 2.0)
    for _ in range(GROW_AFTER):
        sizes.completed(250, 0.9)  # under 4.0 / 4
    assert sizes.size == 500


def test_the_real_statement_timeout_is_the_yardstick_however_soon_a_cancel_came() -> None:
    """A pg_cancel_backend 50 ms into a batch, under a 20 s statement_timeout: batches of
    0.2 s are quick. Had the cancel's 50 ms been the yardstick, they never would be."""
    sizes = at_full_size(8, target=5.0)
    assert sizes.cancelled(0.05, 20.0) is True
    assert (sizes.size, sizes.budget) == (4, 5.0)
    assert [sizes.completed(4, 0.2) for _ in range(GROW_AFTER)] == [False] * (GROW_AFTER - 1) + [True]
    assert sizes.size == 8
    guessed = at_full_size(8, target=5.0)
    guessed.cancelled(0.05, None)  # the timeout unknown: the 50 ms stand for it
    for _ in range(GROW_AFTER * 5):
        guessed.completed(guessed.size, guessed.size * 0.05)
    assert guessed.size < 4


def test_a_short_statement_timeout_caps_the_budget_at_half_of_it() -> None:
    sizes = at_full_size(1000, target=0.5)
    sizes.cancelled(0.3, 0.3)
    assert sizes.budget == 0.15
    sizes.cancelled(0.3, 30.0)  # the session's timeout was raised since
    assert sizes.budget == 0.5


def test_no_statement_timeout_leaves_the_budget_to_the_target() -> None:
    """statement_timeout 0: the cancel was by hand (pg_cancel_backend), and says nothing
    of what one statement may take."""
    sizes = at_full_size(1000, target=0.5)
    sizes.cancelled(0.05, 0.0)
    assert (sizes.size, sizes.budget) == (500, 0.5)


def test_rows_reads_well() -> None:
    assert (rows(1), rows(2), rows(500)) == ("1 row", "2 rows", "500 rows")

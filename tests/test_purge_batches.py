"""The purge's batch size under cancels (``statement_timeout``): pure bookkeeping."""

from __future__ import annotations

from nexus_workflows.deferred.purge_batches import GROW_AFTER, PurgeBatchSize, rows


def test_a_cancel_halves_the_size_down_to_one_row() -> None:
    sizes = PurgeBatchSize(1000)
    seen = []
    while sizes.cancelled(2.0):
        seen.append(sizes.size)
    assert seen == [500, 250, 125, 62, 31, 15, 7, 3, 1]
    assert sizes.cancelled(2.0) is False  # one row cancelled: nothing smaller to try
    assert sizes.size == 1


def test_the_size_never_starts_below_one() -> None:
    assert PurgeBatchSize(0).size == 1


def test_quick_full_batches_double_the_size_back_to_the_maximum() -> None:
    sizes = PurgeBatchSize(1000)
    sizes.cancelled(2.0)
    sizes.cancelled(2.0)
    assert sizes.size == 250
    grew = [sizes.completed(250, 0.4) for _ in range(GROW_AFTER)]  # each under 2.0 / 4
    assert grew == [False] * (GROW_AFTER - 1) + [True]
    assert sizes.size == 500
    for _ in range(GROW_AFTER):
        sizes.completed(500, 0.4)
    assert sizes.size == 1000
    assert not any(sizes.completed(1000, 0.01) for _ in range(GROW_AFTER * 2))  # at the maximum
    assert sizes.size == 1000


def test_growth_stops_at_the_maximum_even_when_it_is_no_power_of_two() -> None:
    sizes = PurgeBatchSize(300)
    sizes.cancelled(1.0)
    assert sizes.size == 150
    for _ in range(GROW_AFTER):
        sizes.completed(150, 0.01)
    assert sizes.size == 300


def test_batches_that_take_a_quarter_of_the_cancelled_time_or_more_keep_the_size() -> None:
    """A batch of 500 that takes 2.6 s under a 3.5 s timeout must not double: the batch
    of 1000 would be cancelled again every few turns."""
    sizes = PurgeBatchSize(1000)
    sizes.cancelled(3.5)
    assert not any(sizes.completed(500, 2.6) for _ in range(GROW_AFTER * 5))
    assert not any(sizes.completed(500, 3.5 / 4) for _ in range(GROW_AFTER * 5))  # not under
    assert sizes.size == 500


def test_a_slow_batch_or_a_cancel_restarts_the_count_of_quick_ones() -> None:
    sizes = PurgeBatchSize(1000)
    sizes.cancelled(2.0)
    for _ in range(GROW_AFTER - 1):
        sizes.completed(500, 0.1)
    sizes.completed(500, 1.0)  # slow: the count starts again
    for _ in range(GROW_AFTER - 1):
        assert sizes.completed(500, 0.1) is False
    assert sizes.completed(500, 0.1) is True
    sizes.cancelled(2.0)
    for _ in range(GROW_AFTER - 1):
        sizes.completed(500, 0.1)
    assert sizes.cancelled(2.0) is True  # before the last quick one
    assert sizes.size == 250
    for _ in range(GROW_AFTER - 1):
        assert sizes.completed(250, 0.1) is False


def test_a_partial_batch_says_nothing_about_a_full_one() -> None:
    sizes = PurgeBatchSize(1000)
    sizes.cancelled(2.0)
    for _ in range(GROW_AFTER - 1):
        sizes.completed(500, 0.1)
    assert sizes.completed(499, 1.9) is False  # the last of a purge: neither quick nor slow
    assert sizes.completed(0, 0.0) is False
    assert sizes.completed(500, 0.1) is True


def test_the_longest_cancel_is_the_yardstick() -> None:
    """Both statement_timeout and pg_cancel_backend raise 57014: an early manual cancel
    must not make the timeout look shorter than a cancel the runner already saw."""
    sizes = PurgeBatchSize(1000)
    sizes.cancelled(4.0)
    sizes.cancelled(0.2)  # someone cancelled a batch by hand
    assert (sizes.size, sizes.cancelled_after) == (250, 4.0)
    for _ in range(GROW_AFTER):
        sizes.completed(250, 0.9)  # under 4.0 / 4
    assert sizes.size == 500


def test_rows_reads_well() -> None:
    assert (rows(1), rows(2), rows(500)) == ("1 row", "2 rows", "500 rows")

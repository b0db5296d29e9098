"""Outage and loop-error back-off of the main loop."""

from __future__ import annotations

from nexus_workflows.deferred.runner.backoff import MAX_BACKOFF, Backoff
from nexus_workflows.deferred.runner.heartbeat import heartbeat_failing
from tests.runner.helpers import FakeClock


def test_an_outage_starts_short_doubles_and_is_capped() -> None:
    backoff = Backoff(poll_interval=5.0, monotonic=FakeClock())
    assert backoff.database_lost() is True  # a new outage: workers re-check connections
    assert (backoff.delay, backoff.epoch) == (0.5, 1)
    waits = []
    for _ in range(8):
        assert backoff.database_lost() is False
        waits.append(backoff.delay)
    assert waits == [1.0, 2.0, 4.0, 8.0, MAX_BACKOFF, MAX_BACKOFF, MAX_BACKOFF, MAX_BACKOFF]
    assert backoff.epoch == 1  # one outage, however long


def test_a_short_poll_interval_shortens_the_first_wait() -> None:
    backoff = Backoff(poll_interval=0.1)
    backoff.database_lost()
    assert backoff.delay == 0.1


def test_success_ends_the_outage_and_says_how_long_it_lasted() -> None:
    clock = FakeClock()
    backoff = Backoff(poll_interval=1.0, monotonic=clock)
    assert backoff.succeeded() is None  # no outage: nothing to report
    backoff.database_lost()
    clock.advance(3.5)
    backoff.database_lost()
    assert backoff.succeeded() == 3.5
    assert (backoff.delay, backoff.in_outage) == (0.0, False)
    assert backoff.database_lost() is True
    assert backoff.epoch == 2


def test_loop_errors_wait_at_least_half_a_second_and_double() -> None:
    backoff = Backoff(poll_interval=0.01)
    delays = []
    for _ in range(6):
        backoff.loop_error()
        delays.append(backoff.delay)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, MAX_BACKOFF]
    assert not backoff.in_outage


def test_claims_pause_after_half_of_stale_after_without_a_heartbeat() -> None:
    assert not heartbeat_failing(14.9, stale_after=30, interval=5)
    assert heartbeat_failing(15.1, stale_after=30, interval=5)
    # Never sooner than one and a half intervals: one slow beat must not pause claiming.
    assert not heartbeat_failing(7.4, stale_after=10, interval=5)
    assert heartbeat_failing(7.6, stale_after=10, interval=5)

"""``rate_limited``: the sliding window of starts, in one process (several threads)."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.db.models import F

from nexus_workflows import InvalidRateLimit, RateLimitTimeout, enqueue_many, rate_limited
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.retention import purge_batch
from nexus_workflows.exceptions import is_permanent
from nexus_workflows.flow.claiming import window_name
from nexus_workflows.flow.windows import busy_count, prune
from nexus_workflows.models import FlowWindowSlot

pytestmark = pytest.mark.django_db(transaction=True)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def test_starts_beyond_the_limit_wait_for_the_window_to_slide() -> None:
    started = time.monotonic()
    stamps = []
    for _ in range(6):
        with rate_limited("test:window", 3, 0.5):
            stamps.append(time.monotonic() - started)
    assert all(stamp < 0.4 for stamp in stamps[:3])
    assert all(stamp >= 0.5 for stamp in stamps[3:])
    assert busy_count("test:window", "", 3, 0.5, using="default") == 3


def test_threads_share_one_window() -> None:
    stamps: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        try:
            with rate_limited("test:threads", 2, 0.5), lock:
                stamps.append(time.monotonic())
        finally:
            connections.close_all()  # this thread's own; else it outlives the test database

    threads = [threading.Thread(target=take) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    stamps.sort()
    assert len(stamps) == 6
    for first, third in zip(stamps, stamps[2:], strict=False):
        assert third - first >= 0.5  # never three starts within one period


def test_timeout_raises_a_transient_error() -> None:
    with rate_limited("test:timeout", 1, 30):
        pass
    started = time.monotonic()
    with (
        pytest.raises(RateLimitTimeout, match=r"no slot of 1 per 30s within 0\.2s") as caught,
        rate_limited("test:timeout", 1, 30, timeout=0.2),
    ):
        pass
    assert 0.15 <= time.monotonic() - started < 2
    assert not is_permanent(caught.value)


def test_async_with() -> None:
    async def twice() -> list[float]:
        stamps = []
        for _ in range(2):
            async with rate_limited("test:async", 1, 0.3):
                stamps.append(time.monotonic())
        await sync_to_async(connections.close_all)()  # the connection of the thread it used
        return stamps

    first, second = asyncio.run(twice())
    assert second - first >= 0.25


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", 1, 1), "name must be a non-empty string"),
        (("x" * 201, 1, 1), "at most 200 characters"),
        (("n", 0, 1), "limit must be a whole number of starts from 1 to 10,000"),
        (("n", True, 1), "limit must be a whole number"),
        (("n", 10_001, 1), "from 1 to 10,000"),  # one window row per start
        (("n", 1, 0), "period must be a number of seconds greater than 0 and at most 31,622,400"),
        (("n", 1, 1e15), "at most 31,622,400 \\(a year\\)"),  # its stamps would leave the range
        (("n", 1, float("nan")), "period must be"),
        (("n", 1, 10**400), "at most 31,622,400"),  # an int no float holds: OverflowError before
        (("n", 1, 1, 10**400), "timeout must be None"),
        (("n", 1, 1, -1), "timeout must be None"),
        (("n", 1, 1, 1e300), "timeout must be None"),
        (("n", 1, 1, False), "timeout must be None"),
        (("bad\ud800", 1, 1), "valid Unicode without NUL"),
        (("bad\x00", 1, 1), "valid Unicode without NUL"),
        # Arguments in the wrong order: the value is named by type, never repeated.
        (("n", "María López", 1), "limit must be a whole number of starts from 1 to 10,000; got str$"),
        (("n", 1, "+52 55 1234 5678"), r"period must be a number of seconds .* \(a year\); got str$"),
        (("n", 1, 1, "María López"), r"number of seconds from 0 to 31,622,400 \(a year\); got str$"),
    ],
)
def test_bad_arguments(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(InvalidRateLimit, match=message) as raised:
        rate_limited(*args)
    assert all(value not in str(raised.value) for value in args[1:] if isinstance(value, str))


def test_prune_drops_only_rows_unused_for_long() -> None:
    with rate_limited("test:prune", 2, 1):
        pass
    # The slot made at the window's creation and never used is ancient; the used one is not.
    assert prune(using="default", older_than=3600) == 1
    assert busy_count("test:prune", "", 2, 1, using="default") == 1


def _age_window(name: str, by: timedelta) -> None:
    # Time passing, as the window sees it: every start of the window that much older.
    FlowWindowSlot.objects.filter(name=name).update(started_at=F("started_at") - by)


def test_the_purge_keeps_a_start_that_still_counts_under_a_period_longer_than_an_hour() -> None:
    with rate_limited("test:two-hourly", 1, 7200):
        pass
    _age_window("test:two-hourly", timedelta(minutes=90))
    purge_batch()  # nothing expired: the purge prunes windows
    assert busy_count("test:two-hourly", "", 1, 7200, using="default") == 1
    with pytest.raises(RateLimitTimeout), rate_limited("test:two-hourly", 1, 7200, timeout=0):
        pass


def test_the_purge_keeps_a_workflows_daily_window_for_a_day_and_then_drops_it(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(1, 86400)).kind
    enqueue_many(kind, [{"key": n} for n in range(2)])
    assert len(Claimer(kinds=[kind], using="default").claim_due(10)) == 1
    name = window_name(kind)
    _age_window(name, timedelta(hours=2))
    purge_batch()
    assert Claimer(kinds=[kind], using="default").claim_due(10) == []  # still one a day
    _age_window(name, timedelta(hours=23))
    purge_batch()
    assert not FlowWindowSlot.objects.filter(name=name).exists()  # a day on: no longer counts


class _RolledBack(Exception):
    pass


@pytest.mark.postgresql
def test_a_start_taken_inside_a_transaction_counts_though_the_transaction_rolls_back() -> None:
    def call_then_fail() -> None:
        with transaction.atomic():
            with rate_limited("test:atomic", 1, 60):
                pass  # the call it counts is made here, whatever the transaction does next
            raise _RolledBack

    with pytest.raises(_RolledBack):
        call_then_fail()
    with pytest.raises(RateLimitTimeout), rate_limited("test:atomic", 1, 60, timeout=0):
        pass


@pytest.mark.postgresql
def test_an_open_transaction_that_took_a_start_does_not_hold_other_callers_past_their_timeout() -> None:
    took, leave = threading.Event(), threading.Event()

    def caller_in_a_long_transaction() -> None:
        try:
            with transaction.atomic():
                with rate_limited("test:held", 1, 0.1):
                    took.set()
                leave.wait(20)  # e.g. a slow request made inside the transaction
        finally:
            connections.close_all()

    holder = threading.Thread(target=caller_in_a_long_transaction)
    holder.start()
    try:
        assert took.wait(10)
        time.sleep(0.2)  # the held start has left its 0.1 s window
        started = time.monotonic()
        with rate_limited("test:held", 1, 0.1, timeout=1):
            waited = time.monotonic() - started
    finally:
        leave.set()
        holder.join(30)
    assert waited < 1


def test_seconds_until_free_reads_the_ring_once() -> None:
    """The wait of a full window, from one read of its rows (it read them twice)."""
    from django.test.utils import CaptureQueriesContext

    from nexus_workflows.flow.windows import seconds_until_free, take_starts

    assert take_starts("read-once", "", 2, 60, 2, using="default") == 2
    with CaptureQueriesContext(connections["default"]) as queries:
        wait = seconds_until_free("read-once", "", 2, 60, using="default")
    assert 59 < wait <= 60.025
    assert len(queries) == 1

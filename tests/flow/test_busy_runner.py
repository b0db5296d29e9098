"""A limited kind on a runner busy with a quick plain backlog: its work starts promptly.

A runner draining quick plain work always holds a prefetch of it in its local queue. A
limited kind's row holds its slot, key or reserved start from its claim, so it is claimed
only where a thread takes it at once; the runner must not wait for its whole plain
backlog to drain first (a review measured 1.62 s behind a 1.59 s backlog), and must not
leave a dead runner's limited work stale that long either.

Each test measures the backlog's drain with a real runner process and checks that the
limited items started within a fraction of it, from the start stamps the items' own
bodies took (tests/testapp/workflows.py, ``span``).
"""

from __future__ import annotations

import functools
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.db.models.functions import Now

from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.models import DeferredWork, Status
from tests.flow.ledger import Span, read_spans
from tests.processes import ManagePy, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAST = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 3, "SHUTDOWN_GRACE": 2}
# Quick items, 2 ms each: about three seconds of drain for one runner of four threads. Each
# runs long enough that its threads, not its loop, set the pace: the runner's queue never
# runs dry between two claims (no-op items on an idle machine can drain it, and then a
# limited row found a free thread even before the fix; the review's runner drained 1,700
# per second).
BACKLOG = 6000
PLAIN_SECONDS = 0.002
# Each limited item must start before this share of the time the backlog took to drain
# (from the first limited enqueue) has passed. One waits for at most a claim turn, the
# kind's rest after a claim that found nothing (flow.claiming._REST, 0.2 s, ended early by
# the NOTIFY the trigger sends on PostgreSQL for a kind the runner rests) and one quick
# attempt; before the fix it waited for the whole backlog (a share of about 1.0).
SHARE = 0.25
# Limited items enqueued one after another, each once the one before started: before the
# fix, one could slip in early when the runner's queue ran dry for a moment (its loop
# descheduled on a loaded machine, now and then), but not each of them.
URGENT = 3

LIMITED = [
    pytest.param("test-flow-capped", marks=pytest.mark.needs("partial_indexes"), id="concurrency"),
    pytest.param("test-flow-rate", id="rate_limit"),
]


def unfinished(kind: str) -> int:
    return DeferredWork.objects.filter(kind=kind, status__in=[Status.PENDING, Status.PROCESSING]).count()


def done(kind: str) -> int:
    return DeferredWork.objects.filter(kind=kind, status=Status.DONE).count()


class BusyRunner:
    """One runner process of four threads taking the plain kind and ``limited``."""

    def __init__(self, limited: str, **settings: object) -> None:
        self.process = ManagePy(
            "runworkflows",
            "--concurrency",
            "4",
            "--kind",
            "test-noop",
            "--kind",
            limited,
            settings={**FAST, **settings},
        )
        self.process.wait_for_output("runner started")

    def start_backlog(self) -> None:
        """Enqueue the plain backlog (one commit) and return once the runner drains it,
        a tenth done: it has timed its quick attempts and prefetches them."""
        with transaction.atomic():
            enqueue_many("test-noop", [{"key": n, "sleep": PLAIN_SECONDS} for n in range(BACKLOG)])
        wait_for(lambda: done("test-noop") >= BACKLOG // 10, timeout=60, interval=0.01, what="draining")

    def drained_at(self) -> float:
        """Wait for the plain backlog to drain; when it was seen drained (time.time())."""
        wait_for(lambda: unfinished("test-noop") == 0, timeout=120, interval=0.01, what="backlog drained")
        return time.time()

    def close(self) -> None:
        try:
            assert self.process.terminate() == 0, self.process.output()
        finally:
            self.process.close()


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.txt"


def started(ledger: Path, key: str) -> Span | None:
    """The span of the limited item ``key``, once its attempt ran."""
    return next((span for span in read_spans(ledger) if span.key == key), None)


def started_share(ledger: Path, since: float, drained: float) -> tuple[float, float]:
    """(seconds from ``since`` to the limited item's start, that as a share of the time
    from ``since`` until the backlog drained)."""
    (span,) = read_spans(ledger)
    delay = span.started - since
    return delay, delay / (drained - since)


@pytest.mark.parametrize("limited", LIMITED)
def test_limited_items_start_before_a_quick_plain_backlog_drains(limited: str, ledger: Path) -> None:
    runner = BusyRunner(limited)
    delays: list[float] = []
    try:
        runner.start_backlog()
        first = time.time()
        left = unfinished("test-noop")
        for number in range(URGENT):
            key = f"urgent-{number}"
            enqueued = time.time()
            enqueue(limited, {"key": key, "ledger": str(ledger)})
            span = wait_for(functools.partial(started, ledger, key), timeout=120, interval=0.005, what=key)
            delays.append(span.started - enqueued)
        drained = runner.drained_at()
    finally:
        runner.close()
    bound = SHARE * (drained - first)
    # The figures, for a run with -s (the README's flow-control section quotes them).
    shown = ", ".join(f"{delay:.3f}" for delay in delays)
    print(f"\n{limited}: started after {shown} s; {left} plain drained in {drained - first:.3f} s")
    assert max(delays) < bound, (
        f"limited items started {shown} s after their enqueues; the plain backlog ({left} "
        f"items) took {drained - first:.3f} s to drain, and each must start within {SHARE:.0%} of that"
    )


@pytest.mark.parametrize("limited", LIMITED)
def test_a_dead_runners_limited_item_is_reclaimed_before_a_quick_plain_backlog_drains(
    limited: str, ledger: Path
) -> None:
    # Due in an hour: no runner claims it before it is made a dead runner's.
    work_id = enqueue(limited, {"key": "orphan", "ledger": str(ledger)}, delay=3600)
    # As few async slots as threads: they take no part here (every kind is sync), and
    # must not count as room for a sync kind's reclaim (the default 100 did, before the
    # fix, and so let reclaims through that the busy sync lane had no room for).
    runner = BusyRunner(limited, ASYNC_CONCURRENCY=4)
    try:
        runner.start_backlog()
        # A runner died holding it (slot 0 of a capped kind): stale from now on.
        since = time.time()
        DeferredWork.objects.filter(pk=work_id).update(
            status=Status.PROCESSING,
            claim_token="dead-runner",
            claimed_at=Now() - timedelta(hours=1),
            heartbeat_at=Now() - timedelta(hours=1),
            flow_slot=0 if limited == "test-flow-capped" else None,
        )
        left = unfinished("test-noop")
        drained = runner.drained_at()
        wait_for(lambda: unfinished(limited) == 0, timeout=60, what="limited item done")
    finally:
        runner.close()
    delay, share = started_share(ledger, since, drained)
    print(f"\n{limited}: reclaimed, started after {delay:.3f} s; {left} drained in {drained - since:.3f} s")
    assert share < SHARE, (
        f"the stale limited item started {delay:.3f} s after it went stale, {share:.0%} of "
        f"the {drained - since:.3f} s the plain backlog ({left} items) took to drain"
    )

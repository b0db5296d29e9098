"""Prometheus metrics with ``prometheus-client``: what one runner does.

:class:`RunnerMetrics` counts what one runner does (in its own memory, whatever
``PROMETHEUS_MULTIPROC_DIR`` says) and serves it, with the database's figures
(:class:`.metrics.DatabaseCollector`), on ``runworkflows --metrics-port``:
``nexus_workflows_attempts_total{kind,outcome}``,
``nexus_workflows_attempt_duration_seconds{kind}``, ``nexus_workflows_in_flight``,
``nexus_workflows_claims_total``, ``nexus_workflows_reclaimed_total{kind}``,
``nexus_workflows_database_outages_total``. Each kind's series start at 0
(:meth:`RunnerMetrics.start_at_zero`): a Django task path's too, at start when it has
rows, or when the runner first claims it; and every series is served at 0 by the first
scrape that shows it (:class:`_FirstServedAtZero`).

Labels are kinds and outcomes only: never a dedupe key, a trigger or an error.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import prometheus_client.metrics
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from nexus_workflows.conf import app_settings
from nexus_workflows.observability import metrics_server
from nexus_workflows.observability.metrics import DatabaseCollector

K = TypeVar("K")
C = TypeVar("C")

OUTCOMES = ("done", "rescheduled", "abandoned", "lost", "released")

# Seconds: quick API calls up to slow multi-step workflows.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, float("inf"))


class _FirstServedAtZero:
    """A series a scrape has not seen yet is served at 0 once, whatever it counts: one
    first seen at 1 is no increase to ``increase()`` and ``rate()`` (a task path claimed
    and ended between two scrapes raised no alert). Its count shows at the next scrape."""

    def __init__(self) -> None:
        self._served = False

    def served(self) -> bool:
        """Whether a scrape served it before (a scrape's thread: this one serves it now)."""
        served, self._served = self._served, True
        return served


class _Count(_FirstServedAtZero):
    """A number that only goes up, in this process's memory (see :class:`RunnerMetrics`)."""

    def __init__(self) -> None:
        super().__init__()
        self.value = 0.0
        self.created = time.time()
        self._lock = threading.Lock()

    def inc(self, amount: float = 1) -> None:
        with self._lock:
            self.value += amount

    def scraped(self) -> float:
        return self.value if self.served() else 0.0


class _Durations(_FirstServedAtZero):
    """One kind's histogram of attempt durations, in this process's memory."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = [0] * len(DURATION_BUCKETS)  # per bucket, not cumulative
        self.sum = 0.0
        self.created = time.time()
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        index = bisect.bisect_left(DURATION_BUCKETS, seconds)  # the first bound >= seconds
        with self._lock:
            self.counts[min(index, len(DURATION_BUCKETS) - 1)] += 1
            self.sum += seconds

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        with self._lock:
            counts, total = list(self.counts), self.sum
        if not self.served():
            counts, total = [0] * len(counts), 0.0
        running, buckets = 0, []
        for bound, n in zip(DURATION_BUCKETS, counts, strict=True):
            running += n
            buckets.append((floatToGoString(bound), float(running)))
        return buckets, total


class RunnerMetrics:
    """One runner's counters, plus the database's figures, on a registry of their own.

    The counters are plain numbers in this process, served by a collector of their own,
    not prometheus-client's ``Counter``/``Histogram``: those write to
    ``PROMETHEUS_MULTIPROC_DIR`` when that is set (as for a web server's workers), where a
    web process's ``MultiProcessCollector`` would serve them a second time, summed with
    every earlier runner's (never reset), and where a directory not made yet would stop the
    runner at start. The runner serves its own counters on its own endpoint.
    """

    def __init__(self, *, kinds: Iterable[str], using: str, in_flight: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.in_flight = in_flight
        self.claims = _Count()
        self.outages = _Count()
        self._attempts: dict[tuple[str, str], _Count] = {}
        self._durations: dict[str, _Durations] = {}
        self._reclaims: dict[str, _Count] = {}
        self._lock = threading.Lock()  # new kinds come from worker threads
        # Every series exists from the start at 0, so rate() and absent() work at once.
        for kind in kinds:
            self.start_at_zero(kind)
        self.registry.register(_RunnerCollector(self))
        self.registry.register(DatabaseCollector(using=using, close_connection=True))
        self._server: Any = None

    def start_at_zero(self, kind: str) -> None:
        """Make ``kind``'s series (every outcome, its durations, its reclaims) at 0 where
        they are not yet.

        A series that first appears at 1 is missed by ``increase()`` and ``rate()``: a
        kind given up on for the first time would raise no alert. Registered kinds and
        the Django task paths with rows start at 0 when the runner does; a task path
        enqueued later, when this runner first claims it (before its attempt can end)."""
        if (kind, OUTCOMES[0]) in self._attempts:
            return  # the common case, on every claim: nothing to make
        for outcome in OUTCOMES:
            self.attempt_ended(kind, outcome, count_only=True)
        self._duration(kind)
        self._reclaim(kind)

    def _child(self, children: dict[K, C], key: K, make: Callable[[], C]) -> C:
        """``children[key]``, made at first use (worker threads add kinds; the lock only
        then, not on every count)."""
        child = children.get(key)
        if child is None:
            with self._lock:
                child = children.setdefault(key, make())
        return child

    def _reclaim(self, kind: str) -> _Count:
        return self._child(self._reclaims, kind, _Count)

    def reclaimed(self, kind: str) -> None:
        """A claim of ``kind`` this runner took over from a runner not heard from for
        ``STALE_AFTER`` after its attempt started: that attempt was lost (killed, or it
        lost the database), and nobody else counts it (a killed runner counts nothing).
        A claim lost before its attempt started is no attempt, and is not counted."""
        self._reclaim(kind).inc()

    def _duration(self, kind: str) -> _Durations:
        return self._child(self._durations, kind, _Durations)

    def attempt_ended(self, kind: str, outcome: str, *, count_only: bool = False) -> None:
        child = self._child(self._attempts, (kind, outcome), _Count)
        if not count_only:
            child.inc()

    def observe_duration(self, kind: str, seconds: float) -> None:
        self._duration(kind).observe(seconds)

    def series(
        self,
    ) -> tuple[list[tuple[tuple[str, str], _Count]], list[tuple[str, _Durations]], list[tuple[str, _Count]]]:
        """The attempts', the durations' and the reclaims' series, sorted (a scrape's
        thread reads them while worker threads may add a kind)."""
        with self._lock:
            return (
                sorted(self._attempts.items()),
                sorted(self._durations.items()),
                sorted(self._reclaims.items()),
            )

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` in a daemon thread; returns the port (0 picks
        one). Raises :class:`~.metrics_server.MetricsEndpointUnavailable` when it cannot
        listen there; a connection idle for ``METRICS_IDLE_TIMEOUT`` is dropped, and one
        beyond ``METRICS_MAX_CONNECTIONS`` served at once is closed."""
        self._server = metrics_server.serve(
            host,
            port,
            self.registry,
            idle_timeout=float(app_settings.METRICS_IDLE_TIMEOUT),
            max_connections=int(app_settings.METRICS_MAX_CONNECTIONS),
        )
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _RunnerCollector(Collector):
    """:class:`RunnerMetrics`' own counters, as prometheus-client's would show them."""

    def __init__(self, metrics: RunnerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Any]:
        metrics = self.metrics
        attempt_series, duration_series, reclaim_series = metrics.series()
        attempts = CounterMetricFamily(
            "nexus_workflows_attempts",
            "Attempts ended, by kind and outcome (done, rescheduled, abandoned, lost, released).",
            labels=["kind", "outcome"],
        )
        for (kind, outcome), count in attempt_series:
            attempts.add_metric([kind, outcome], count.scraped(), created=_created(count.created))
        duration = HistogramMetricFamily(
            "nexus_workflows_attempt_duration_seconds", "Seconds prepare ran, per attempt.", labels=["kind"]
        )
        for kind, durations in duration_series:
            buckets, total = durations.cumulative()
            duration.add_metric([kind], buckets, total)
            _add_created(duration, {"kind": kind}, durations.created)
        in_flight = GaugeMetricFamily(
            "nexus_workflows_in_flight", "Attempts whose prepare is running now.", value=metrics.in_flight()
        )
        claims = CounterMetricFamily(
            "nexus_workflows_claims",
            "Rows this runner claimed (due and reclaimed).",
            value=metrics.claims.scraped(),
            created=_created(metrics.claims.created),
        )
        reclaimed = CounterMetricFamily(
            "nexus_workflows_reclaimed",
            "Attempts lost by a runner not heard from for STALE_AFTER after they started (it "
            "was killed or lost the database), counted by the runner that took their claims "
            "over, by kind.",
            labels=["kind"],
        )
        for kind, count in reclaim_series:
            reclaimed.add_metric([kind], count.scraped(), created=_created(count.created))
        outages = CounterMetricFamily(
            "nexus_workflows_database_outages",
            "Times this runner lost the database (each outage once).",
            value=metrics.outages.scraped(),
            created=_created(metrics.outages.created),
        )
        return [attempts, duration, in_flight, claims, reclaimed, outages]


def _created(created: float) -> float | None:
    """A series' ``_created`` time, or None when prometheus-client's own metrics leave it
    out (``PROMETHEUS_DISABLE_CREATED_SERIES``, ``disable_created_metrics()``): ours
    follow the same switch."""
    return created if getattr(prometheus_client.metrics, "_use_created", True) else None


def _add_created(family: HistogramMetricFamily, labels: dict[str, str], created: float) -> None:
    """A histogram's ``_created`` sample, as prometheus-client's ``Histogram`` gives one:
    ``HistogramMetricFamily.add_metric`` takes no ``created`` (CounterMetricFamily's does)."""
    if _created(created) is not None:
        family.samples.append(Sample(family.name + "_created", labels, created))

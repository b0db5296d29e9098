"""Prometheus metrics with ``prometheus-client``: the database's figures.

:class:`DatabaseCollector` asks the database at scrape time (any process may expose it;
:func:`nexus_workflows.views.metrics` does, and so does every runner's endpoint,
:mod:`.runner_metrics`): ``nexus_workflows_work{kind,status}``,
``nexus_workflows_oldest_due_age_seconds{kind}``, ``nexus_workflows_stale_claims{kind}``
(processing rows whose runner is gone), ``nexus_workflows_runners{state}`` and, for kinds
with flow limits (issue 19), ``nexus_workflows_flow_slots_in_use{kind}`` and
``nexus_workflows_flow_waiting{kind,limit}`` (limit: key, slot or rate), and
``nexus_workflows_due_unknown_kind{kind}``: due rows of kinds no runner of the project
runs (not registered, or a Django task that does not import), which stay pending.

Labels are kinds, statuses and limit names only: never a dedupe key, a serial or rate
key, a trigger or an error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from django.db import Error as DatabaseError  # InterfaceError included
from django.db import connections
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from nexus_workflows.observability.figures import COUNTED_STATUSES, work_figures
from nexus_workflows.observability.runners import count_alive

logger = logging.getLogger(__name__)

#: Seconds a scrape waits for another scrape's read of the database before it goes
#: without the database's figures: a healthy read takes milliseconds (about 20 ms with a
#: million retained rows), a stalled one as long as the stall.
SCRAPE_WAIT = 2.0


class DatabaseCollector(Collector):
    """Figures read from the database when Prometheus scrapes.

    ``close_connection``: close this thread's connection afterwards, for servers that
    run each scrape on a new thread (the runner's endpoint) and would otherwise leave
    one connection behind per scrape. ``swallow_errors``: when the database does not
    answer, yield nothing (so the runner's own counters are still served) instead of raising;
    and while one scrape waits for the database, the others wait at most
    :data:`SCRAPE_WAIT` for it, then yield nothing. Prometheus gives up on a slow scrape and
    tries again: during a stall each attempt would otherwise hold a thread and a connection
    of its own until the database answered, when connections are scarcest. (They did not
    wait at all before 2026-12: two Prometheus servers scraping at the same moment, the
    usual pair, left the database's figures out of half the scrapes and logged a false
    WARNING with the database healthy.)
    """

    def __init__(
        self, *, using: str = "default", close_connection: bool = False, swallow_errors: bool = True
    ) -> None:
        self.using = using
        self.close_connection = close_connection
        self.swallow_errors = swallow_errors
        self._asking = threading.Lock()  # one scrape asks the database at a time
        # Whether the last scrape went without the database's figures: Prometheus scrapes
        # every few seconds, and an outage is logged once when it starts and once at its end.
        self._missing = False
        self._missing_lock = threading.Lock()

    def describe(self) -> Iterable[Any]:
        return list(self._families())  # names only: registering must not query

    def _families(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "nexus_workflows_work",
            "Deferred work rows by kind and status (pending, processing, abandoned).",
            labels=["kind", "status"],
        )
        yield GaugeMetricFamily(
            "nexus_workflows_oldest_due_age_seconds",
            "How long the most overdue item of a kind has waited: a due pending item since it "
            "became due, a stale claim since it went stale (0 when none is).",
            labels=["kind"],
        )
        yield GaugeMetricFamily(
            "nexus_workflows_stale_claims",
            "Processing rows of a kind whose heartbeat is older than STALE_AFTER, or that have "
            "none: their runner died or lost the database, or another session has held a lock "
            "on the row that long. A live runner of the kind takes them over (one with no "
            "heartbeat waits for an operator).",
            labels=["kind"],
        )
        yield GaugeMetricFamily(
            "nexus_workflows_runners",
            "runworkflows processes seen within STALE_AFTER (alive) or not (dead).",
            labels=["state"],
        )
        yield GaugeMetricFamily(
            "nexus_workflows_flow_slots_in_use",
            "Processing rows of a kind with flow limits, across all runners: its concurrency "
            "slots in use (a stale claim holds its slot until it is reclaimed).",
            labels=["kind"],
        )
        yield GaugeMetricFamily(
            "nexus_workflows_flow_waiting",
            "Due items of a kind with flow limits that wait, by the limit holding them back "
            "(key: a serial key; slot: concurrency; rate: the rate window).",
            labels=["kind", "limit"],
        )
        yield GaugeMetricFamily(
            "nexus_workflows_due_unknown_kind",
            "Due pending rows of a kind no workflow registers in the project (or a Django task "
            "that does not import): no runner claims them, they stay pending.",
            labels=["kind"],
        )

    def collect(self) -> Iterable[Any]:
        from nexus_workflows.flow.report import flow_metrics

        work, oldest, stale, runners, slots, waiting, unknown = self._families()
        if not self._asking.acquire(timeout=SCRAPE_WAIT if self.swallow_errors else -1):
            self._figures_missing("the database's figures left out; an earlier scrape still waits for them")
            return []
        try:
            figures = work_figures(self.using)
            alive, dead = count_alive(self.using)
            flow = flow_metrics(using=self.using)
        except DatabaseError as error:
            if not self.swallow_errors:
                raise
            # The runner's own counters are still worth serving during an outage.
            self._figures_missing(f"the database did not answer ({type(error).__name__})")
            return []
        finally:
            if self.close_connection:
                with contextlib.suppress(Exception):
                    connections[self.using].close()
            self._asking.release()
        self._figures_back()
        for kind in figures.kinds:
            for status in COUNTED_STATUSES:
                work.add_metric([kind, status.value], figures.count(kind, status.value))
            oldest.add_metric([kind], figures.oldest_due_age(kind))
            stale.add_metric([kind], figures.stale.get(kind, 0))
        runners.add_metric(["alive"], alive)
        runners.add_metric(["dead"], dead)
        for kind, numbers in flow.items():
            slots.add_metric([kind], numbers["slots_in_use"])
            for name, n in numbers.items():
                if name.startswith("waiting_"):
                    waiting.add_metric([kind, name.removeprefix("waiting_")], n)
        for kind, n in figures.due_unknown.items():
            unknown.add_metric([kind], n)
        return [work, oldest, stale, runners, slots, waiting, unknown]

    def _figures_missing(self, why: str) -> None:
        with self._missing_lock:
            first, self._missing = not self._missing, True
        # Later scrapes of the same outage at DEBUG: one WARNING per outage, not per scrape.
        logger.log(logging.WARNING if first else logging.DEBUG, "metrics: %s", why)

    def _figures_back(self) -> None:
        with self._missing_lock:
            back, self._missing = self._missing, False
        if back:
            logger.info("metrics: the database's figures are served again")


def database_registry(using: str = "default") -> CollectorRegistry:
    """A registry with only the database's figures; collecting it raises the database's errors."""
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(using=using, swallow_errors=False))
    return registry

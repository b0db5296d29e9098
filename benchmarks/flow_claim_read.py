"""A limited kind's due claim behind due rows of other kinds, old order against new, on
PostgreSQL or MariaDB. A measurement, not a test.

    DATABASE_URL=postgres://…/nw_flow_read .venv/bin/python benchmarks/flow_claim_read.py
    DATABASE_URL=mysql://…/nw_flow_read .venv/bin/python benchmarks/flow_claim_read.py

``--rows`` due rows of a kind with ``concurrency=``, then ``--ahead`` due rows of another
kind due an hour earlier (a workflow's priority is always 0: those come first). Timed, in
alternating blocks: the flow claim's candidate read (the first 3 ids) in the old order
(``priority DESC``: ``nw_due_idx`` filtered by kind) and the new
(``sql.postgresql.due_in_order``: ``nw_due_kind_idx``), and the whole
``Claimer.claim_due(3)`` with each (each claim undone outside the timing, its rate window's
reservations too). On MariaDB both orders are the same ORM order; the old one is timed with
migration 0018's indexes ignored (``ALTER INDEX … IGNORED``), as before 0018.

``--flow``: the kind's limit, ``concurrency=10`` (refused on MariaDB by the check E009 alone),
``rate_limit=(10, 60)`` (``rate``: the read of ``_first``) or the same per rate key
(``rate-key``: the read of ``_pick``, each candidate's window counted in it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

KIND = "bench-limited"


def old_order(candidates: Any) -> Any:
    return candidates.order_by("-priority", "next_attempt_at", "pk")


FLOWS: dict[str, dict[str, Any]] = {
    "concurrency": {"concurrency": 10},
    "rate": {"rate_limit": (10, 60)},
    "rate-key": {"rate_limit": (10, 60), "rate_key": lambda trigger: str(trigger)},
}


def candidate_read(ordered: Any) -> Any:
    """The flow claim's read of the first 3 candidates (``FlowClaimer._pick``'s, per rate key)."""
    from django.db.models import F, Value
    from django.db.models.functions import Coalesce

    from nexus_workflows.deferred.registry import registry
    from nexus_workflows.flow.claiming import busy_starts_subquery

    flow = registry.get(KIND).flow
    if flow.rate_key is None:
        return ordered.values_list("pk", flat=True)[:3]
    return (
        ordered.annotate(window_key=Coalesce(F("rate_key_hash"), Value("")))
        .annotate(busy=busy_starts_subquery(KIND, flow))
        .filter(busy__lt=flow.rate_limit[0])
        .values_list("pk", "window_key", "busy")[:12]
    )


def timed_read(order: Any) -> float:
    from nexus_workflows.clock import DatabaseNow
    from nexus_workflows.models import DeferredWork

    candidates = DeferredWork.objects.filter(kind=KIND, status="pending", next_attempt_at__lte=DatabaseNow())
    started = time.perf_counter()
    ids = list(candidate_read(order(candidates)))
    took = (time.perf_counter() - started) * 1000
    assert len(ids) >= 3
    return took


def timed_claim(order: Any) -> float:
    from nexus_workflows import sql
    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.models import DeferredWork, FlowWindowSlot

    module = sql.for_connection("default")
    kept = module.due_in_order
    module.due_in_order = order
    try:
        started = time.perf_counter()
        works = Claimer(kinds=[KIND], using="default").claim_due(3)
        took = (time.perf_counter() - started) * 1000
    finally:
        module.due_in_order = kept
    assert len(works) == 3
    DeferredWork.objects.filter(pk__in=[w.id for w in works]).update(status="pending", flow_slot=None)
    FlowWindowSlot.objects.update(started_at=datetime(1970, 1, 1, tzinfo=UTC))  # every start free again
    return took


def measure(options: Any, label: str) -> None:
    from benchmarks.unknown_kinds import mariadb_indexes_ignored
    from nexus_workflows import sql

    orders = {"old": old_order, "new": sql.for_connection("default").due_in_order}
    reads: dict[str, list[float]] = {name: [] for name in orders}
    claims: dict[str, list[float]] = {name: [] for name in orders}
    for _block in range(options.blocks):
        for name, order in orders.items():
            with mariadb_indexes_ignored(name == "old"):
                reads[name] += [timed_read(order) for _ in range(options.runs)]
                claims[name] += [timed_claim(order) for _ in range(options.runs)]
    for what, timings in (("candidate read", reads), ("claim_due(3)", claims)):
        figures = ", ".join(f"{name} {statistics.median(ms):.2f} ms" for name, ms in timings.items())
        print(f"  {label}, {what}: median {figures} ({options.blocks * options.runs} each)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--ahead", type=int, default=200_000)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--flow", choices=sorted(FLOWS), default="concurrency")
    options = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from benchmarks.unknown_kinds import analyze, fill
    from nexus_workflows.deferred.registry import registry
    from nexus_workflows.models import DeferredWork

    registry.register(
        KIND,
        dedupe_key=lambda t: str(t),
        prepare=lambda t, c, s: None,
        retry_schedule=[1],
        **FLOWS[options.flow],
    )
    call_command("migrate", verbosity=0)
    vendor = connection.vendor
    assert vendor in ("postgresql", "mysql"), "the per-kind read is PostgreSQL's and MariaDB's"
    table = DeferredWork._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")
        fill(cursor, vendor, table, KIND, 60, options.rows, "")
        analyze(cursor, vendor, table)
    print(f"{vendor}; {options.flow}; load average {os.getloadavg()[0]:.2f} (1 min) at the start")
    measure(options, "no other kind's rows")
    with connection.cursor() as cursor:
        fill(cursor, vendor, table, "other-kind", 3600, options.ahead)
        analyze(cursor, vendor, table)
    measure(options, f"{options.ahead:,} due rows of another kind first")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")


if __name__ == "__main__":
    main()

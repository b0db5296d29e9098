"""What the operator's view costs at a million retained rows (PostgreSQL).

    .venv/bin/python benchmarks/operator_view.py [--database-url URL] [--rows 1000000]

Fills its own database (``nw_operator_bench`` by default, emptied first) with ``--rows`` done
rows, 2% abandoned, a pending backlog (half of it due) and a few processing rows, plus a day
of per-minute outcome counts for ten kinds, then times at scrape time:

* ``work_figures``: the queries behind ``nexus_workflows_work`` and
  ``nexus_workflows_oldest_due_age_seconds`` (one per counted status, plus the oldest due);
* the whole ``/metrics`` view body (``generate_latest`` of the database registry);
* the dashboard's data (``dashboard.build``);
* for comparison, counting the done rows per kind, which the metrics deliberately skip.

Each is timed before and after ``VACUUM ANALYZE`` (this machine runs PostgreSQL with
autovacuum off, so the first figures are what a freshly filled table gives). Prints figures
and the plans; asserts nothing.

``--drain N`` instead drains N no-op items with an in-process runner (4 threads, the
benchmark settings) and reports how many outcome-count upserts it made and the time they took,
against the drain's wall time: the counts' share of the drain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.deferred_throughput import ensure_postgres_database  # noqa: E402
from benchmarks.growth import TABLE, execute, insert_rows, setup, vacuum_analyze  # noqa: E402


def timed(function: Callable[[], Any], runs: int) -> dict[str, float]:
    function()  # warm: connection, plan cache
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1000)
    return {"median_ms": round(statistics.median(samples), 2), "max_ms": round(max(samples), 2)}


def fill(rows: int) -> dict[str, Any]:
    execute(f"TRUNCATE {TABLE}")
    execute("TRUNCATE nexus_workflows_outcomecount")
    started = time.perf_counter()
    insert_rows(rows, prefix="done-", status="done", age="2 hours")
    insert_rows(rows // 50, prefix="abandoned-", status="abandoned", age="3 hours")
    insert_rows(rows // 100, prefix="pending-", status="pending", age="10 minutes")
    # Half of the backlog is due later, as retried work is.
    execute(
        f"UPDATE {TABLE} SET next_attempt_at = now() + interval '1 hour' "
        "WHERE status = 'pending' AND id %% 2 = 0"
    )
    insert_rows(100, prefix="processing-", status="processing", age="1 second")
    execute(f"UPDATE {TABLE} SET heartbeat_at = now() WHERE status = 'processing'")
    # Spread the rows over ten kinds, as a real table is.
    execute(f"UPDATE {TABLE} SET kind = 'bench-kind-' || (id %% 10)")
    execute(
        "INSERT INTO nexus_workflows_outcomecount (minute, kind, outcome, count) "
        "SELECT date_trunc('minute', now()) - m * interval '1 minute', 'bench-kind-' || k, o, 5 "
        "FROM generate_series(0, 1439) AS m, generate_series(0, 9) AS k, "
        "unnest(ARRAY['done', 'rescheduled', 'abandoned']) AS o"
    )
    return {"fill_seconds": round(time.perf_counter() - started, 1)}


def plans() -> dict[str, str]:
    found = {}
    for status in ("pending", "processing", "abandoned", "done"):
        rows = execute(
            f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT kind, count(*) FROM {TABLE} "
            "WHERE status = %s GROUP BY kind",
            [status],
        )
        found[status] = "\n".join(row[0] for row in rows)
    return found


def measure(runs: int) -> dict[str, Any]:
    from django.db.models import Count
    from prometheus_client import generate_latest

    from nexus_workflows.models import DeferredWork
    from nexus_workflows.observability import dashboard
    from nexus_workflows.observability.figures import work_figures
    from nexus_workflows.observability.metrics import database_registry

    registry = database_registry("default")

    def done_per_kind() -> Any:
        return list(DeferredWork.objects.filter(status="done").values("kind").annotate(n=Count("pk")))

    return {
        "work_figures": timed(lambda: work_figures("default"), runs),
        "metrics_view_body": timed(lambda: generate_latest(registry), runs),
        "dashboard_build": timed(lambda: dashboard.build("default"), runs),
        "done_rows_per_kind_for_comparison": timed(done_per_kind, max(3, runs // 4)),
    }


def drain_cost(items: int) -> dict[str, Any]:
    from nexus_workflows import enqueue_many
    from nexus_workflows.deferred.runner import Runner
    from nexus_workflows.models import DeferredWork
    from nexus_workflows.observability import counts

    execute(f"TRUNCATE {TABLE}")
    vacuum_analyze()
    enqueue_many("bench-noop", [{"key": f"drain-{number}"} for number in range(items)])
    spent: list[float] = []
    original = counts.add

    def timed_add(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    counts.add = timed_add
    try:
        started = time.perf_counter()
        stats = Runner(once=True, kinds=["bench-noop"], install_signal_handlers=False).run()
        wall = time.perf_counter() - started
    finally:
        counts.add = original
    assert DeferredWork.objects.filter(status="done").count() == stats.done
    return {
        "items": items,
        "done": stats.done,
        "drain_seconds": round(wall, 2),
        "drain_per_second": round(stats.done / wall),
        "count_upserts": len(spent),
        "items_per_upsert": round(stats.done / max(len(spent), 1), 1),
        "upsert_ms_total": round(sum(spent) * 1000, 1),
        "upsert_ms_median": round(statistics.median(spent) * 1000, 2) if spent else None,
        "share_of_drain_percent": round(100 * sum(spent) / wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/nw_operator_bench")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--drain", type=int, default=0, metavar="N")
    options = parser.parse_args()
    ensure_postgres_database(options.database_url)
    setup(options.database_url)
    if options.drain:
        import logging

        logging.getLogger("nexus_workflows").setLevel(logging.WARNING)  # no line per item
        print(json.dumps(drain_cost(options.drain)))
        return
    report: dict[str, Any] = {"rows": options.rows, **fill(options.rows)}
    report["before_vacuum"] = measure(options.runs)
    report["vacuum_seconds"] = round(vacuum_analyze(), 1)
    report["after_vacuum"] = measure(options.runs)
    report["plans_after_vacuum"] = plans()
    for phase in ("before_vacuum", "after_vacuum"):
        print(f"--- {phase}")
        for name, figures in report[phase].items():
            print(f"{name:40} median {figures['median_ms']:8.2f} ms   max {figures['max_ms']:8.2f} ms")
    for status, plan in report["plans_after_vacuum"].items():
        print(f"--- plan: count per kind, status = {status}\n{plan}")
    print(json.dumps({key: value for key, value in report.items() if key != "plans_after_vacuum"}))


if __name__ == "__main__":
    main()

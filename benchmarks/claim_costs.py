"""What a due claim costs: with and without ``SKIP LOCKED``, and behind due rows no runner
claims (kinds removed from the code). PostgreSQL only. A measurement, not a test.

    DATABASE_URL=postgres://…/nw_claim_costs .venv/bin/python benchmarks/claim_costs.py

1. ``--rows`` due rows of ``bench-noop`` (and as many of ``bench-quick``); claims of
   ``--limit`` rows by ``Claimer.claim_due``, each undone by an ``UPDATE`` back to pending
   (outside the timing), in blocks alternating the claim with ``SKIP LOCKED`` (as it is)
   and without (``sql.postgresql.claimable`` replaced by the plain filter, the old claim).
2. ``--orphans`` due rows of a kind no runner has, due before the rest: ``EXPLAIN
   (ANALYZE, BUFFERS)`` of the claim's ``SELECT`` and its median time, then the same
   read per kind (``LATERAL``, one index scan per kind of the runner) over a temporary
   index on (kind, priority, next_attempt_at) of pending rows, with and without orphans.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

FILL = """
INSERT INTO {table} (kind, dedupe_key, trigger, checkpoints, status, attempt, next_attempt_at,
    claim_token, last_error, history, created_at, updated_at, priority, queue_name,
    backend_name, worker_ids, errors, lost_unstarted)
SELECT %s, %s || n, '{{}}', '{{}}', 'pending', 0, now() - %s * interval '1 second'
    + n * interval '1 microsecond', '', '', '[]', now(), now(), 0, '', '', '[]', '[]', 0
FROM generate_series(1, %s) AS n
"""

LATERAL = """
SELECT w.id FROM unnest(%s::text[]) AS k(kind),
LATERAL (SELECT id, priority, next_attempt_at FROM {table}
         WHERE kind = k.kind AND status = 'pending' AND next_attempt_at <= now()
         ORDER BY priority DESC, next_attempt_at LIMIT %s) AS w
ORDER BY w.priority DESC, w.next_attempt_at LIMIT %s
"""


def median_ms(run: Any, runs: int) -> float:
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--orphans", type=int, default=200_000)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--runs", type=int, default=50)
    options = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.models import DeferredWork
    from nexus_workflows.sql import postgresql

    call_command("migrate", verbosity=0)
    table = DeferredWork._meta.db_table
    kinds = ["bench-noop", "bench-quick"]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")
        for kind in kinds:
            cursor.execute(FILL.format(table=table), [kind, kind, 60, options.rows])
        cursor.execute(f"VACUUM ANALYZE {table}")
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)")
    claimer = Claimer(kinds=kinds, queues=[], using="default")
    skip_locked = postgresql.claimable

    def plain(candidates: Any, ids: Any) -> Any:
        return candidates.filter(pk__in=ids)

    def claim_and_undo() -> float:
        started = time.perf_counter()
        works = claimer.claim_due(options.limit)
        took = (time.perf_counter() - started) * 1000
        DeferredWork.objects.filter(pk__in=[work.id for work in works]).update(status="pending")
        return took

    timings: dict[str, list[float]] = {"skip locked": [], "plain": []}
    for block in range(options.blocks * 2):
        mode = "skip locked" if block % 2 == 0 else "plain"
        postgresql.claimable = skip_locked if mode == "skip locked" else plain  # type: ignore[assignment]
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM {table}")  # each block starts from a table without dead rows
        timings[mode] += [claim_and_undo() for _ in range(options.runs)]
    postgresql.claimable = skip_locked  # type: ignore[assignment]
    for mode, values in timings.items():
        print(
            f"claim_due({options.limit}) of {2 * options.rows:,} due rows, {mode}: median "
            f"{statistics.median(values):.2f} ms, p90 {statistics.quantiles(values, n=10)[-1]:.2f} ms "
            f"({len(values)} claims)"
        )
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {postgresql_claim_sql(claimer, options.limit)}")
        print("the claim's UPDATE (SKIP LOCKED), one run:")
        print("\n".join(f"    {row[0]}" for row in cursor.fetchall()))
    orphans(options, claimer, table, kinds)


def postgresql_claim_sql(claimer: Any, limit: int) -> str:
    """The claim's UPDATE for the first ``limit`` due ids, as text (EXPLAIN ANALYZE runs
    it: it claims them; the benchmark's table is truncated after)."""
    from django.db import connection
    from django.db.models.sql import UpdateQuery

    from nexus_workflows.clock import DatabaseNow
    from nexus_workflows.models import DeferredWork
    from nexus_workflows.sql import postgresql

    due = DeferredWork.objects.due(DatabaseNow()).filter(claimer._selection())
    ids = list(due.order_by("-priority", "next_attempt_at").values_list("pk", flat=True)[:limit])
    query = postgresql.claimable(due, ids).query.chain(UpdateQuery)
    query.add_update_values({"status": "processing", "claim_token": "x"})
    sql, params = query.get_compiler("default").as_sql()
    with connection.cursor() as cursor:
        return cursor.mogrify(sql, params)


def orphans(options: Any, claimer: Any, table: str, kinds: list[str]) -> None:
    from django.db import connection

    from nexus_workflows.models import DeferredWork

    def select() -> Any:
        due = DeferredWork.objects.due(time_now()).filter(claimer._selection())
        return due.order_by("-priority", "next_attempt_at").values_list("pk", flat=True)[: options.limit]

    def lateral(of: list[str] = kinds) -> None:
        with connection.cursor() as cursor:
            cursor.execute(LATERAL.format(table=table), [of, options.limit, options.limit])
            cursor.fetchall()

    # A runner of 21 kinds, 19 of them with nothing due: one index probe each.
    many = [*kinds, *(f"bench-absent-{n}" for n in range(19))]

    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET status = 'pending' WHERE status <> 'pending'")
        print(
            f"no orphans: the claim's SELECT, median {median_ms(lambda: list(select()), options.runs):.2f} ms"
        )
        cursor.execute(FILL.format(table=table), ["gone-kind", "gone", 3600, options.orphans])
        cursor.execute(f"VACUUM ANALYZE {table}")
        sql, params = select().query.sql_with_params()
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        print(f"{options.orphans:,} due rows of a kind no runner has, due first; the claim's SELECT:")
        print("\n".join(f"    {row[0]}" for row in cursor.fetchall()))
        print(f"  median {median_ms(lambda: list(select()), options.runs):.2f} ms")
        started = time.perf_counter()
        cursor.execute(
            f"CREATE INDEX CONCURRENTLY nw_bench_kind_due ON {table} (kind, priority DESC, next_attempt_at) "
            "WHERE status = 'pending'"
        )
        print(
            f"an index on (kind, priority DESC, next_attempt_at) of pending rows: built in "
            f"{time.perf_counter() - started:.2f} s (CONCURRENTLY) over "
            f"{options.orphans + 2 * options.rows:,} rows"
        )
        cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + LATERAL.format(table=table), [kinds, options.limit, options.limit]
        )
        print("per kind (LATERAL) over it:")
        print("\n".join(f"    {row[0]}" for row in cursor.fetchall()))
        print(
            f"  median {median_ms(lateral, options.runs):.2f} ms with the orphans; for a runner of 21 kinds "
            f"{median_ms(lambda: lateral(many), options.runs):.2f} ms"
        )
        cursor.execute(f"DELETE FROM {table} WHERE kind = 'gone-kind'")
        cursor.execute(f"VACUUM ANALYZE {table}")
        print(
            f"  median {median_ms(lateral, options.runs):.2f} ms without them; the claim's SELECT "
            f"{median_ms(lambda: list(select()), options.runs):.2f} ms"
        )
        cursor.execute("DROP INDEX nw_bench_kind_due")
        cursor.execute(f"TRUNCATE {table}")


def time_now() -> Any:
    from nexus_workflows.clock import DatabaseNow

    return DatabaseNow()


if __name__ == "__main__":
    main()

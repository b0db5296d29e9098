"""The claim's due query on a table of pending work: its plan and its cost.

    DATABASE_URL=postgres://…/nw_due_query .venv/bin/python benchmarks/due_query.py [--rows 100000]

Fills the table (after TRUNCATE) with ``--rows`` pending rows: workflows and Django tasks,
a spread of priorities, a quarter of them due later (retries, ``run_after``), then prints
``EXPLAIN (ANALYZE, BUFFERS)`` of the SELECT that ``Claimer.claim_due`` runs, and its median
time through the ORM. PostgreSQL only. A measurement, not a test.
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=30)
    options = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.deferred.registry import registry
    from nexus_workflows.models import DeferredWork

    call_command("migrate", verbosity=0)
    table = DeferredWork._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")
        # Three in four rows are tasks (priorities -10, 0, 0, 10, 50), one in four workflows;
        # one in four rows of each is due in an hour.
        cursor.execute(
            f"""
            INSERT INTO {table} (kind, dedupe_key, trigger, checkpoints, status, attempt,
                next_attempt_at, claim_token, last_error, history, created_at, updated_at,
                priority, queue_name, backend_name, worker_ids, errors, lost_unstarted)
            SELECT CASE WHEN n %% 4 = 0 THEN 'bench-noop' ELSE 'benchmarks.tasks.noop' END,
                   'k' || n, '{{}}', '{{}}', 'pending', 0,
                   now() - interval '1 minute'
                       + CASE WHEN n %% 4 = 1 THEN interval '1 hour' ELSE interval '0' END
                       + n * interval '1 microsecond',
                   '', '', '[]', now(), now(),
                   CASE WHEN n %% 4 = 0 THEN 0 ELSE (ARRAY[-10, 0, 0, 10, 50])[1 + n %% 5] END,
                   CASE WHEN n %% 4 = 0 THEN '' ELSE 'default' END,
                   CASE WHEN n %% 4 = 0 THEN '' ELSE 'default' END, '[]', '[]', 0
            FROM generate_series(1, %s) AS n
            """,
            [options.rows],
        )
        cursor.execute(f"VACUUM ANALYZE {table}")
    claimer = Claimer(kinds=registry.kinds(deferred=True), queues=None, using="default")
    now = timezone.now()

    def query() -> Any:
        due = DeferredWork.objects.due(now).filter(claimer._selection())
        return due.order_by("-priority", "next_attempt_at").values_list("pk", flat=True)[:100]

    sql, params = query().query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        plan = [row[0] for row in cursor.fetchall()]
    timings = []
    for _ in range(options.runs):
        started = time.perf_counter()
        list(query())
        timings.append((time.perf_counter() - started) * 1000)
    print(f"{options.rows:,} pending rows; the claim's SELECT (LIMIT 100):")
    print("\n".join(f"    {line}" for line in plan))
    print(f"through the ORM: median {statistics.median(timings):.2f} ms over {options.runs} runs")
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")


if __name__ == "__main__":
    main()

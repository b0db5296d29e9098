"""What migration 0018's two MariaDB indexes cost a row's writes. A measurement, not a test.

    DATABASE_URL=mysql://…/nw_index_cost .venv/bin/python benchmarks/mariadb_due_index_cost.py

Two copies of the work table (``CREATE TABLE … LIKE``), each holding ``--rows`` pending rows;
one without ``nw_mariadb_due_kind_idx`` and ``nw_mariadb_due_queue_idx``. No DDL between the
timings: ``--blocks`` blocks alternate the two tables, each block ``--runs`` rows, each row
written as its life writes it, in autocommit (a commit each): the enqueue's ``INSERT``, the
claim's ``UPDATE`` to processing and the done-write's ``UPDATE`` to done (both move the row's
entries in every index keyed by the status). Medians of each statement per table.
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

TABLES = {"with": "nw_cost_with", "without": "nw_cost_without"}
INSERT = (
    "INSERT INTO {table} (kind, dedupe_key, `trigger`, checkpoints, status, attempt, next_attempt_at, "
    "claim_token, last_error, history, created_at, updated_at, priority, queue_name, backend_name, "
    "worker_ids, errors, lost_unstarted) VALUES (%s, %s, '{{}}', '{{}}', 'pending', 0, UTC_TIMESTAMP(6), "
    "'', '', '[]', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 0, '', '', '[]', '[]', 0)"
)
STEPS = ("insert", "claim", "done")


def one_row(cursor: Any, table: str, key: str) -> dict[str, float]:
    """Milliseconds of each of the row's three writes."""
    took: dict[str, float] = {}
    started = time.perf_counter()
    cursor.execute(INSERT.format(table=table), ["bench-cost", key])
    pk = cursor.lastrowid
    took["insert"] = time.perf_counter() - started
    for step, status in (("claim", "processing"), ("done", "done")):
        started = time.perf_counter()
        cursor.execute(f"UPDATE {table} SET status = %s, claim_token = %s WHERE id = %s", [status, key, pk])
        took[step] = time.perf_counter() - started
    return {step: seconds * 1000 for step, seconds in took.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=300)
    options = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from benchmarks.unknown_kinds import fill
    from nexus_workflows.models import DeferredWork
    from nexus_workflows.sql import mysql

    call_command("migrate", verbosity=0)
    assert connection.vendor == "mysql", "migration 0018's indexes are MariaDB's"
    work = DeferredWork._meta.db_table
    with connection.cursor() as cursor:
        for table in TABLES.values():
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
            cursor.execute(f"CREATE TABLE {table} LIKE {work}")
            fill(cursor, "mysql", table, "bench-old", 60, options.rows)
        with connection.schema_editor() as editor:
            mysql.drop_due_indexes(editor, TABLES["without"])
        print(f"mysql; load average {os.getloadavg()[0]:.2f} (1 min) at the start")
        timings = {mode: {step: [] for step in STEPS} for mode in TABLES}
        for block in range(options.blocks):
            mode = ("with", "without")[block % 2]
            for n in range(options.runs):
                for step, ms in one_row(cursor, TABLES[mode], f"b{block}-{n}").items():
                    timings[mode][step].append(ms)
        for step in STEPS:
            figures = ", ".join(f"{mode} {statistics.median(timings[mode][step]):.3f} ms" for mode in TABLES)
            print(f"  {step}: median {figures} ({len(timings['with'][step])} each)")
        print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
        for table in TABLES.values():
            cursor.execute(f"DROP TABLE {table}")


if __name__ == "__main__":
    main()

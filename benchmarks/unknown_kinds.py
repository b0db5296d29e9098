"""The due claim behind due rows no runner here takes (a kind removed from the code), old
read against new, on PostgreSQL or MariaDB. A measurement, not a test.

    DATABASE_URL=postgres://…/nw_unknown_kinds .venv/bin/python benchmarks/unknown_kinds.py
    DATABASE_URL=mysql://…/nw_unknown_kinds .venv/bin/python benchmarks/unknown_kinds.py

Real work: ``--rows`` due rows of each of two workflow kinds and as many Django tasks in
queue ``default`` (priorities -10..50); the runner takes the two kinds and that queue.
Then the claim's read (its SELECT) and the whole ``Claimer.claim_due`` (its commit left
out: each block is one transaction, rolled back), of 1 and of 100 rows, each claim undone
(back to pending) outside the timing, in blocks alternating the old read (``nw_due_idx``
in order, filtered by kind and queue: the ORM's, with the new indexes dropped in the
block's transaction, as before migration 0016) and the new one (``sql.postgresql.due_ids``:
one ordered read per kind and queue, merged), with no unknown rows and with ``--unknown``
due rows (half of a kind gone from the code, half tasks of a queue nobody runs) due an
hour before the real work. On MariaDB the old read is the ORM's with migration 0018's
indexes ignored (``ALTER INDEX … IGNORED``: still written, never read, as before 0018), the
new one ``sql.mysql.due_ids``. Last, what the new indexes cost: their size, an insert of
``--rows`` rows with and without them, and ``enqueue()`` of one row (alternating blocks).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")

COLUMNS = [
    "kind",
    "dedupe_key",
    "trigger",
    "checkpoints",
    "status",
    "attempt",
    "next_attempt_at",
    "claim_token",
    "last_error",
    "history",
    "created_at",
    "updated_at",
    "priority",
    "queue_name",
    "backend_name",
    "worker_ids",
    "errors",
    "lost_unstarted",
]
# Parameters: kind, key prefix, seconds before now, priority step (0: all 0), queue, rows.
FILL = {
    "postgresql": """INSERT INTO {table} ({columns})
SELECT %s, %s || n, '{{}}', '{{}}', 'pending', 0,
    now() - %s * interval '1 second' + n * interval '1 microsecond', '', '', '[]', now(), now(),
    (ARRAY[-10, 0, 0, 10, 50])[1 + n %% 5] * %s, %s, %s, '[]', '[]', 0
FROM generate_series(1, %s) AS n""",
    "mysql": """INSERT INTO {table} ({columns})
SELECT %s, CONCAT(%s, seq), '{{}}', '{{}}', 'pending', 0,
    UTC_TIMESTAMP(6) - INTERVAL %s SECOND + INTERVAL seq MICROSECOND, '', '', '[]',
    UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), ELT(1 + seq %% 5, -10, 0, 0, 10, 50) * %s, %s, %s,
    '[]', '[]', 0
FROM seq_1_to_{rows}""",
}
KINDS = ["bench-noop", "bench-quick"]


def fill(cursor: Any, vendor: str, table: str, kind: str, ago: int, rows: int, queue: str = "") -> None:
    step = 1 if queue else 0  # workflows' priority is always 0
    params = [kind, kind, ago, step, queue, queue]
    if vendor == "postgresql":
        params.append(rows)
    columns = ", ".join(cursor.db.ops.quote_name(column) for column in COLUMNS)  # trigger: a keyword
    cursor.execute(FILL[vendor].format(table=table, rows=rows, columns=columns), params)


def analyze(cursor: Any, vendor: str, table: str) -> None:
    cursor.execute(f"VACUUM ANALYZE {table}" if vendor == "postgresql" else f"ANALYZE TABLE {table}")
    if vendor != "postgresql":
        cursor.fetchall()


def claims(options: Any, label: str) -> None:
    """Median read (the claim's SELECT) and whole claim_due, of 1 and of 100 rows, old read
    and new, in alternating blocks."""
    from django.db import connection

    from nexus_workflows.deferred.claims import Claimer

    class OldClaimer(Claimer):
        def _due_reader(self, now: Any) -> Any:
            return lambda limit: None  # the ORM's read of nw_due_idx

    runners: dict[str, type[Claimer]] = {"old": OldClaimer, "new": Claimer}
    if connection.vendor not in ("postgresql", "mysql"):
        runners = {"as is": Claimer}
    for limit in (1, 100):
        reads: dict[str, list[float]] = {name: [] for name in runners}
        whole: dict[str, list[float]] = {name: [] for name in runners}
        for _block in range(options.blocks):
            for name, kind in runners.items():
                claimer = kind(kinds=KINDS, queues=["default"], using="default")
                with old_schema(name == "old"):
                    reads[name] += [timed(read, claimer, limit) for _ in range(options.runs)]
                    whole[name] += [claim_and_undo(claimer, limit) for _ in range(options.runs)]
        for what, timings in (("its read", reads), ("claim_due", whole)):
            figures = ", ".join(f"{name} {statistics.median(ms):.2f} ms" for name, ms in timings.items())
            print(f"  {label}, {what} of {limit}: median {figures} ({options.blocks * options.runs} each)")


@contextlib.contextmanager
def old_schema(old: bool) -> Iterator[None]:
    """One transaction, rolled back (so no commit is timed, in either mode); for the old
    read, without the new indexes (dropped in it: the rollback puts them back), as before
    migration 0016, where the planner had only nw_due_idx to read in order. MariaDB rolls
    back no DDL: its indexes (0018) are ignored by the optimizer around the block instead."""
    from django.db import connection, transaction

    with mariadb_indexes_ignored(old), transaction.atomic():
        if old and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("DROP INDEX nw_due_kind_idx, nw_due_queue_idx")
        yield
        transaction.set_rollback(True)


@contextlib.contextmanager
def mariadb_indexes_ignored(ignored: bool) -> Iterator[None]:
    """On MariaDB (10.6+), when ``ignored``, migration 0018's indexes are left out of every
    plan in the block (still maintained: an instant change of the table's metadata), so the
    ORM's read plans as before 0018. Elsewhere nothing."""
    from django.db import connection

    from nexus_workflows.models import DeferredWork
    from nexus_workflows.sql.mysql import DUE_INDEXES

    if not ignored or connection.vendor != "mysql":
        yield
        return
    table = DeferredWork._meta.db_table

    def alter(visibility: str) -> None:
        with connection.cursor() as cursor:
            for name in DUE_INDEXES:
                cursor.execute(f"ALTER TABLE {table} ALTER INDEX {name} {visibility}")

    alter("IGNORED")
    try:
        yield
    finally:
        alter("NOT IGNORED")


def timed(run: Any, *args: Any) -> float:
    started = time.perf_counter()
    run(*args)
    return (time.perf_counter() - started) * 1000


def read(claimer: Any, limit: int) -> list[Any]:
    """What the claim reads before its UPDATE: the new read where it answers, else the ORM's."""
    from nexus_workflows.clock import DatabaseNow
    from nexus_workflows.models import DeferredWork

    found = claimer._due_reader(None)(limit)
    if found is not None:
        return list(found)
    due = DeferredWork.objects.due(DatabaseNow()).filter(claimer._selection())
    return list(due.order_by("-priority", "next_attempt_at").values_list("pk", "queue_name")[:limit])


def claim_and_undo(claimer: Any, limit: int) -> float:
    from nexus_workflows.models import DeferredWork

    started = time.perf_counter()
    works = claimer.claim_due(limit)
    took = (time.perf_counter() - started) * 1000
    assert len(works) == limit
    DeferredWork.objects.filter(pk__in=[w.id for w in works]).update(status="pending")
    return took


NEW_INDEXES = {
    "postgresql": ("nw_due_kind_idx", "nw_due_queue_idx"),
    "mysql": ("nw_mariadb_due_kind_idx", "nw_mariadb_due_queue_idx"),
}
SIZES = {
    "postgresql": "SELECT relname, pg_relation_size(oid) FROM pg_class WHERE relname IN {names} "
    "ORDER BY relname",
    # InnoDB's persistent statistics (ANALYZE TABLE first): pages of 16 KiB by default.
    "mysql": "SELECT index_name, stat_value * @@innodb_page_size FROM mysql.innodb_index_stats "
    "WHERE database_name = DATABASE() AND stat_name = 'size' AND index_name IN {names} ORDER BY index_name",
}


def index_costs(options: Any, table: str) -> None:
    """The new indexes' size, and an insert of --rows rows and enqueue() of one row with and
    without them (alternating blocks)."""
    from django.db import connection

    vendor = connection.vendor
    names = NEW_INDEXES[vendor]
    with connection.cursor() as cursor:
        analyze(cursor, vendor, table)
        cursor.execute(SIZES[vendor].format(names=_literals("nw_due_idx", *names)))
        sizes = ", ".join(f"{name} {size / 2**20:.1f} MiB" for name, size in cursor.fetchall())
        print(f"index sizes: {sizes}")
        took: dict[str, list[float]] = {"with": [], "without": []}
        enqueues: dict[str, list[float]] = {"with": [], "without": []}
        for block in range(6):
            mode = "with" if block % 2 == 0 else "without"
            if mode == "without":
                rebuild = new_indexes_dropped(cursor, vendor, table, names)
            started = time.perf_counter()
            fill(cursor, vendor, table, "bench-insert", 0, options.rows // 2)
            fill(cursor, vendor, table, "bench.tasks.noop", 0, options.rows // 2, "default")
            took[mode].append(time.perf_counter() - started)
            enqueues[mode] += enqueue_one_by_one(block, options.runs * 4)
            cursor.execute(f"DELETE FROM {table} WHERE kind IN ('bench-insert', 'bench.tasks.noop')")
            if mode == "without":
                rebuild()
            if vendor == "postgresql":
                cursor.execute(f"VACUUM {table}")
        print(
            f"insert of {options.rows:,} pending rows (half workflows, half tasks): median "
            f"{statistics.median(took['with']):.2f} s with the new indexes, "
            f"{statistics.median(took['without']):.2f} s without"
        )
        print(
            f"enqueue() of one workflow row, autocommit (a commit each): median "
            f"{statistics.median(enqueues['with']):.3f} ms with the new indexes, "
            f"{statistics.median(enqueues['without']):.3f} ms without ({len(enqueues['with'])} each)"
        )


def _literals(*names: str) -> str:
    return "(" + ", ".join(f"'{name}'" for name in names) + ")"  # the indexes' own names


def new_indexes_dropped(cursor: Any, vendor: str, table: str, names: tuple[str, ...]) -> Any:
    """Drop the new indexes; returns what builds them again."""
    from django.db import connection

    from nexus_workflows.sql import mysql

    if vendor == "mysql":
        with connection.schema_editor() as editor:
            mysql.drop_due_indexes(editor, table)

        def build_mysql() -> None:
            with connection.schema_editor() as editor:
                mysql.add_due_indexes(editor, table)

        return build_mysql
    cursor.execute(f"SELECT indexdef FROM pg_indexes WHERE indexname IN {_literals(*names)}")
    definitions = [row[0] for row in cursor.fetchall()]
    cursor.execute(f"DROP INDEX {', '.join(names)}")

    def build_postgresql() -> None:
        for definition in definitions:
            cursor.execute(definition)

    return build_postgresql


def enqueue_one_by_one(block: int, count: int) -> list[float]:
    """Milliseconds of each of ``count`` enqueue() calls of a workflow (deleted after)."""
    from nexus_workflows import enqueue
    from nexus_workflows.models import DeferredWork

    timings = [timed(enqueue, "bench-noop", {"key": f"one-{block}-{n}"}) for n in range(count)]
    DeferredWork.objects.filter(dedupe_key__startswith=f"one-{block}-").delete()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--unknown", type=int, default=200_000)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--costs-only", action="store_true", help="only the indexes' costs (PostgreSQL)")
    options = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from nexus_workflows.models import DeferredWork

    call_command("migrate", verbosity=0)
    vendor, table = connection.vendor, DeferredWork._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")
        for kind in KINDS:
            fill(cursor, vendor, table, kind, 60, options.rows)
        fill(cursor, vendor, table, "benchmarks.tasks.noop", 60, options.rows, "default")
        analyze(cursor, vendor, table)
    print(f"{vendor}; load average {os.getloadavg()[0]:.2f} (1 min) at the start")
    if not options.costs_only:
        claims(options, "no unknown rows")
    with connection.cursor() as cursor:
        # Half workflows of a kind gone from the code, half tasks of a queue nobody runs
        # (at priorities -10..50, as the real tasks): due an hour before the real work.
        fill(cursor, vendor, table, "gone-kind", 3600, options.unknown // 2)
        fill(cursor, vendor, table, "gone.tasks.noop", 3600, options.unknown // 2, "nobody")
        analyze(cursor, vendor, table)
    if not options.costs_only:
        claims(options, f"{options.unknown:,} unknown due rows first")
    if vendor in NEW_INDEXES:
        index_costs(options, table)
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")


if __name__ == "__main__":
    main()

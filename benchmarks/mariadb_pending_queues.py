"""A runner of every task queue (``queues=None``) on MariaDB: how it finds the queues with
pending tasks, old against new, and what that costs its claims. A measurement, not a test.

    DATABASE_URL=mysql://…/nw_queues .venv/bin/python benchmarks/mariadb_pending_queues.py

``--queues`` queues of Django tasks holding ``--rows`` due rows between them (priorities
-10..50), and ``--workflows`` due rows of a workflow kind no runner takes; the runner takes
every queue and no kind. Timed, in alternating blocks: the search for the queues alone, the
claim's read (``sql.mysql.due_ids``) and the whole ``Claimer.claim_due`` of 1 and of 10 rows
(each claim undone outside the timing), the queues found by the old loop (one
``MIN(queue_name) … > previous`` probe, one round trip, per queue) and by the new statement.
Round trips per claim are the session's ``Questions`` (the count's own read left out).
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

_OLD_NEXT_QUEUE = "SELECT MIN(queue_name) FROM {table} WHERE status = 'pending' AND queue_name > %s"


def old_pending_queues(cursor: Any, table: str, using: str) -> list[str]:
    """The loop before: one probe of nw_mariadb_due_queue_idx, one round trip, per queue."""
    queues: list[str] = []
    while True:
        cursor.execute(_OLD_NEXT_QUEUE.format(table=table), [queues[-1] if queues else ""])
        (name,) = cursor.fetchone()
        if name is None:
            return queues
        queues.append(name)


@contextlib.contextmanager
def finder(name: str) -> Iterator[None]:
    """The queues found by the old loop (``old``) or by ``sql.mysql``'s own (``new``)."""
    from nexus_workflows.sql import mysql

    kept = mysql._pending_queues
    if name == "old":
        mysql._pending_queues = old_pending_queues
    try:
        yield
    finally:
        mysql._pending_queues = kept


def questions() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Questions'")
        return int(cursor.fetchone()[1])


def round_trips(run: Any) -> int:
    """Statements ``run`` sent, by the session's count (less the count's own read)."""
    before = questions()
    run()
    return questions() - before - 1


def timed(run: Any) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1000


def search(table: str) -> list[str]:
    from django.db import connection

    from nexus_workflows.sql import mysql

    with connection.cursor() as cursor:
        found = mysql._pending_queues(cursor, connection.ops.quote_name(table), "default")
    return list(found)


def claim_and_undo(claimer: Any, limit: int) -> float:
    from nexus_workflows.models import DeferredWork

    started = time.perf_counter()
    works = claimer.claim_due(limit)
    took = (time.perf_counter() - started) * 1000
    assert len(works) == limit
    DeferredWork.objects.filter(pk__in=[w.id for w in works]).update(status="pending")
    return took


def count_round_trips(claimer: Any, table: str, queues: int) -> None:
    """Round trips of the claim's read and of whole claims, with each finder."""
    from nexus_workflows.models import DeferredWork
    from nexus_workflows.sql import mysql

    for name in ("old", "new"):
        with finder(name):
            found = search(table)
            assert len(found) == queues, (name, len(found))
            read = round_trips(lambda: mysql.due_ids("default", [], None, None, 1))
            trips = {limit: round_trips(lambda n=limit: claimer.claim_due(n)) for limit in (1, 10)}
        DeferredWork.objects.filter(status="processing").update(status="pending")
        print(
            f"  {name}: round trips of the claim's read {read}; of claim_due(1) {trips[1]}, (10) {trips[10]}"
        )


def measure(options: Any, table: str) -> None:
    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.sql import mysql

    claimer = Claimer(kinds=[], queues=None, using="default")
    count_round_trips(claimer, table, options.queues)
    names = ("old", "new")
    searches: dict[str, list[float]] = {name: [] for name in names}
    reads: dict[int, dict[str, list[float]]] = {n: {name: [] for name in names} for n in (1, 10)}
    claims: dict[int, dict[str, list[float]]] = {n: {name: [] for name in names} for n in (1, 10)}
    for _block in range(options.blocks):
        for name in names:
            with finder(name):
                searches[name] += [timed(lambda: search(table)) for _ in range(options.runs)]
                for limit in (1, 10):
                    read = lambda n=limit: mysql.due_ids("default", [], None, None, n)  # noqa: E731
                    reads[limit][name] += [timed(read) for _ in range(options.runs)]
                    claims[limit][name] += [claim_and_undo(claimer, limit) for _ in range(options.runs)]
    each = options.blocks * options.runs
    print(f"  finding the queues: {figures(searches)} ({each} each)")
    for limit in (1, 10):
        print(f"  the claim's read of {limit}: {figures(reads[limit])} ({each} each)")
        print(f"  claim_due({limit}): {figures(claims[limit])} ({each} each)")


def figures(timings: dict[str, list[float]]) -> str:
    return "median " + ", ".join(f"{name} {statistics.median(ms):.2f} ms" for name, ms in timings.items())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--workflows", type=int, default=0)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--runs", type=int, default=25)
    options = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from benchmarks.unknown_kinds import analyze, fill
    from nexus_workflows.models import DeferredWork

    call_command("migrate", verbosity=0)
    vendor, table = connection.vendor, DeferredWork._meta.db_table
    assert vendor == "mysql", "the queues' search measured here is MariaDB's"
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")
        for number in range(options.queues):
            queue = f"queue-{number:02d}"
            fill(
                cursor, vendor, table, f"bench.tasks.q{number:02d}", 60, options.rows // options.queues, queue
            )
        if options.workflows:
            fill(cursor, vendor, table, "gone-kind", 3600, options.workflows)
        analyze(cursor, vendor, table)
    print(
        f"{vendor}; {options.queues} queues, {options.rows:,} task rows, {options.workflows:,} "
        f"workflow rows; load average {os.getloadavg()[0]:.2f} (1 min) at the start"
    )
    measure(options, table)
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {table}")


if __name__ == "__main__":
    main()

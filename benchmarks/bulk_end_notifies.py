"""What one statement that ends (or releases) N attempts of a rested limited kind costs, and
how many NOTIFYs it sends: the ending function of migration 0019 ("<id> <kind>" per row)
against 0020's ("ended <kind>", merged by PostgreSQL within the transaction).

    .venv/bin/python benchmarks/bulk_end_notifies.py [--rows 1000] [--rounds 5]

PostgreSQL. Each round: N rows of a ``concurrency=N`` kind are claimed by one claim,
another session holds the kind's ending lock (as a runner resting the kind does) and
LISTENs, and one ``UPDATE`` ends them all (``transitions.finish_done``, autocommit). The
app is migrated to 0019 and to 0020 in turn, rounds alternating. Prints the median time
of that statement and the notifications that arrived. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.deferred_throughput import DEFAULT_DATABASE_URL, ensure_postgres_database  # noqa: E402

VERSIONS = {"0019": "0019_notify_attempt_ended_while_full", "0020": "0020_notify_ended_kind_once"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
    return parser.parse_args()


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def raw_connection() -> Any:
    import psycopg
    from django.db import connection

    params = dict(connection.get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    return psycopg.connect(**params, autocommit=True)


def one_round(kind: str, rows: int, number: int) -> tuple[float, int]:
    """(seconds the ending statement took, notifications received) for one round."""
    from nexus_workflows import enqueue_many
    from nexus_workflows.deferred import transitions
    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.deferred.wakeup import CHANNEL
    from nexus_workflows.sql import postgresql

    enqueue_many(kind, [{"n": f"{number}-{n}"} for n in range(rows)])
    works = Claimer(kinds=[kind], using="default").claim_due(rows)
    assert len(works) == rows, len(works)
    with raw_connection() as listener, raw_connection() as resting:
        postgresql.listen(listener, CHANNEL)
        postgresql.hold_rest_lock(resting, kind, lock_timeout=5, lock_class=postgresql.ENDING_LOCK_CLASS)
        began = time.perf_counter()
        transitions.finish_done(works)
        took = time.perf_counter() - began
        resting.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        received = 0
        for notification in listener.notifies(timeout=10):
            if notification.payload == "marker":
                break
            received += 1
    return took, received


def main() -> None:
    args = parse_args()
    if args.database_url.startswith("postgres"):
        ensure_postgres_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.core.management import call_command

    from nexus_workflows.deferred.registry import registry
    from nexus_workflows.models import DeferredWork

    call_command("migrate", verbosity=0)
    kind = "bench-bulk-end"
    DeferredWork.objects.filter(kind=kind).delete()
    registry.register(
        kind, dedupe_key=lambda t: str(t["n"]), prepare=noop, retry_schedule=[1], concurrency=args.rows
    )
    results: dict[str, list[tuple[float, int]]] = {version: [] for version in VERSIONS}
    try:
        for number in range(args.rounds):
            for version, migration in VERSIONS.items():
                call_command("migrate", "nexus_workflows", migration, verbosity=0)
                results[version].append(one_round(kind, args.rows, number * 2 + (version == "0020")))
    finally:
        call_command("migrate", verbosity=0)
        DeferredWork.objects.filter(kind=kind).delete()
    for version, rounds in results.items():
        times = [took * 1000 for took, _ in rounds]
        notified = sorted({received for _, received in rounds})
        print(
            f"{version}: ending {args.rows} rows took a median {statistics.median(times):.1f} ms "
            f"(rounds: {', '.join(f'{t:.1f}' for t in times)}); NOTIFYs received: {notified}"
        )


if __name__ == "__main__":
    main()

"""A serial-key kind whose due rows all wait behind busy keys: what each runner turn costs.

    .venv/bin/python benchmarks/serial_held_turns.py [--rows 5000] [--keys 50]

In-process (no runner process): ``--rows`` due rows of a ``serial_key`` kind spread over
``--keys`` keys, one row of each key processing (claimed first). Then a second runner's
flow claim (``flow.claiming.FlowClaimer.claim_due``, as a busy runner calls it many
times a second) is timed over ``--turns`` turns, one every 2 ms: its queries per turn
and the median turn. Nothing of the kind can start until an attempt of a key ends.

It is a measurement, not a test: nothing here asserts a speed
(``tests/flow/test_full_kinds_rest.py`` counts the queries).
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


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
    return parser.parse_args()


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def main() -> None:
    args = parse_args()
    if args.database_url.startswith("postgres"):
        ensure_postgres_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from nexus_workflows import enqueue_many
    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.deferred.registry import registry
    from nexus_workflows.flow.claiming import FlowClaimer
    from nexus_workflows.models import DeferredWork

    call_command("migrate", verbosity=0)
    kind = "bench-serial-held"
    DeferredWork.objects.filter(kind=kind).delete()
    registry.register(
        kind,
        dedupe_key=lambda t: str(t["n"]),
        prepare=noop,
        retry_schedule=[1],
        serial_key=lambda t: str(t["key"]),
    )
    enqueue_many(kind, [{"n": n, "key": n % args.keys} for n in range(args.rows)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE nexus_workflows_deferredwork")
    holder = FlowClaimer.for_kinds([kind], "default")
    assert holder is not None
    works: list[Any] = []
    holder.claim_due(
        Claimer(kinds=[kind], using="default", worker_id="holder"), args.keys, None, args.keys, works
    )
    print(f"{len(works)} keys busy, {args.rows - len(works)} due rows behind them")
    resting = FlowClaimer.for_kinds([kind], "default")
    assert resting is not None
    claimer = Claimer(kinds=[kind], using="default", worker_id="resting")
    times: list[float] = []
    with CaptureQueriesContext(connection) as queries:
        for _ in range(args.turns):
            began = time.perf_counter()
            resting.claim_due(claimer, 10, None, 10, [])
            times.append((time.perf_counter() - began) * 1000)
            time.sleep(0.002)
    print(
        f"{len(queries) / args.turns:.2f} queries per turn, median turn {statistics.median(times):.3f} ms, "
        f"mean {statistics.fmean(times):.3f} ms over {args.turns} turns"
    )
    DeferredWork.objects.filter(kind=kind).delete()


if __name__ == "__main__":
    main()

"""A limited kind's item on a runner busy with a quick plain backlog: how long it waits.

    .venv/bin/python benchmarks/limited_on_busy_runner.py [--database-url postgres://…/nw_bench]

One ``runworkflows`` process (default settings, the benchmark workflows and the limited
kinds of ``benchmarks/flowapp``). Each round enqueues a backlog of plain items in one
commit (no-ops, or with ``--plain-seconds`` items that wait that long) and, once the
runner has drained a tenth of it, one item of ``bench-capped`` (``concurrency=4``); it
prints how long that item took to start (from the start stamp its attempt journals)
next to how long the rest of the backlog took to drain.

No-op items on an idle machine can leave the runner's queue empty between two claims
(its loop, not its threads, sets the pace), and then a limited item found a free thread
even before limited work was claimed past a prefetch; items of a few ms cannot.

It is a measurement, not a test: nothing here asserts a speed
(``tests/flow/test_busy_runner.py`` asserts the bound).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.deferred_throughput import (  # noqa: E402
    DEFAULT_DATABASE_URL,
    RunnerProcess,
    _vacuum,
    ensure_postgres_database,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, default=2700, help="plain items in each backlog (default 2700)")
    parser.add_argument("--plain-seconds", type=float, default=0.0, help="each plain item's wait (default 0)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.database_url.startswith("postgres"):
        ensure_postgres_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["BENCH_FLOW"] = "1"  # the runner process inherits it
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from nexus_workflows import enqueue, enqueue_many
    from nexus_workflows.models import DeferredWork, Status

    call_command("migrate", verbosity=0)
    DeferredWork.objects.filter(kind__startswith="bench-").delete()
    vacuum = _vacuum(connection)
    vacuum()

    plain = "bench-quick" if args.plain_seconds else "bench-noop"
    extra = {"sleep": args.plain_seconds} if args.plain_seconds else {}

    def unfinished(kind: str) -> int:
        return DeferredWork.objects.filter(kind=kind, status__in=[Status.PENDING, Status.PROCESSING]).count()

    def done(kind: str) -> int:
        return DeferredWork.objects.filter(kind=kind, status=Status.DONE).count()

    journal = Path(tempfile.mkdtemp(prefix="bench-busy-")) / "journal.txt"
    delays: list[float] = []
    drains: list[float] = []
    runner = RunnerProcess(args.database_url, None)
    try:
        runner.wait_started()
        for number in range(args.rounds):
            with transaction.atomic():
                enqueue_many(plain, [{"key": f"busy-{number}-{n}", **extra} for n in range(args.items)])
            while done(plain) < args.items // 10:
                time.sleep(0.002)
            enqueued = time.time()
            enqueue("bench-capped", {"key": f"busy-{number}", "journal": str(journal)})
            left = unfinished(plain)
            while unfinished(plain):
                time.sleep(0.002)
            drained = time.time()
            while unfinished("bench-capped"):
                time.sleep(0.01)
            started = float(journal.read_text().splitlines()[-1].split()[0])
            delays.append(started - enqueued)
            drains.append(drained - enqueued)
            print(
                f"round {number + 1}: the capped item started after {started - enqueued:.3f} s; "
                f"the {left} plain items left drained in {drained - enqueued:.3f} s"
            )
            DeferredWork.objects.filter(kind__startswith="bench-").delete()
            vacuum()
    finally:
        runner.stop()
    print(
        f"median: started after {statistics.median(delays):.3f} s, "
        f"backlog drained in {statistics.median(drains):.3f} s ({args.rounds} rounds)"
    )


if __name__ == "__main__":
    main()

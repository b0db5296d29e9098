"""Flow control under three runner processes on one PostgreSQL (issue 19, item 5).

    .venv/bin/python benchmarks/flow_control.py [--database-url postgres://…/nw_bench]

Prints, for one run:

* ``concurrency=4`` with 200 ms attempts: the share of the four slots kept busy while a
  backlog waited (attempt-seconds done / (4 x wall seconds));
* ``rate_limit=(20, 1)`` with a backlog: starts per second (from the start times the
  attempts journal) and the most starts seen in any one-second window;
* ``serial_key`` over 1,000 keys, no-op work: drain rate, next to an unlimited kind's
  drain rate measured in the same run with the same three runners.

It is a measurement, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
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


def read_journal(path: Path) -> list[tuple[float, float]]:
    spans = []
    for line in path.read_text().splitlines():
        started, ended = line.split()
        spans.append((float(started), float(ended)))
    return spans


def most_in_window(starts: list[float], period: float) -> int:
    """The most start stamps in any half-open window [t, t + period)."""
    most, first = 0, 0
    for last, at in enumerate(starts):
        while at - starts[first] >= period:
            first += 1
        most = max(most, last - first + 1)
    return most


def max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--runners", type=int, default=3)
    parser.add_argument("--capped-items", type=int, default=120)
    parser.add_argument("--rate-items", type=int, default=300)
    parser.add_argument("--drain-items", type=int, default=5000)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    ensure_postgres_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["BENCH_FLOW"] = "1"  # the limited kinds of benchmarks/flowapp
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from nexus_workflows import enqueue_many
    from nexus_workflows.models import DeferredWork, FlowWindowSlot, Status

    call_command("migrate", verbosity=0)
    DeferredWork.objects.filter(kind__startswith="bench-").delete()
    FlowWindowSlot.objects.filter(name__startswith="workflow:bench-").delete()
    vacuum = _vacuum(connection)
    vacuum()

    def unfinished(kind: str) -> int:
        return DeferredWork.objects.filter(kind=kind, status__in=[Status.PENDING, Status.PROCESSING]).count()

    def drain(kind: str, triggers: list[dict]) -> float:
        enqueue_many(kind, triggers)
        started = time.perf_counter()
        while unfinished(kind):
            time.sleep(0.01)
        return time.perf_counter() - started

    runners = [RunnerProcess(args.database_url, None) for _ in range(args.runners)]
    try:
        for runner in runners:
            runner.wait_started()
        time.sleep(1.0)

        # 1. concurrency=4, 200 ms attempts.
        journals = Path(tempfile.mkdtemp(prefix="flow-bench-"))
        capped_journal = journals / "capped.txt"
        wall = drain(
            "bench-capped",
            [{"key": f"c{n}", "journal": str(capped_journal)} for n in range(args.capped_items)],
        )
        busy = args.capped_items * 0.2 / (4 * wall)
        spans = read_journal(capped_journal)
        first_start = min(started for started, _ in spans)
        last_end = max(ended for _, ended in spans)
        attempt_seconds = sum(ended - started for started, ended in spans)
        busy_while_backlog = attempt_seconds / (4 * (last_end - first_start))
        peak = max_overlap(spans)

        # 2. rate_limit=(20, 1) with a backlog.
        rate_journal = journals / "rate.txt"
        drain("bench-rate", [{"key": f"r{n}", "journal": str(rate_journal)} for n in range(args.rate_items)])
        starts = sorted(started for started, _ in read_journal(rate_journal))
        rate = (len(starts) - 1) / (starts[-1] - starts[0])
        most = most_in_window(starts, 1.0)
        most_09 = most_in_window(starts, 0.9)
        # The closest that 21 starts came: over 1.0 s means no 1 s window held 21.
        tightest = min(later - first for first, later in zip(starts, starts[20:], strict=False))

        # 3. serial_key over 1,000 keys vs an unlimited kind, same runners, same run.
        vacuum()
        unlimited = args.drain_items / drain(
            "bench-noop", [{"key": f"u{n}"} for n in range(args.drain_items)]
        )
        vacuum()
        serial = args.drain_items / drain(
            "bench-serial", [{"key": f"s{n}", "to": f"patient-{n % 1000}"} for n in range(args.drain_items)]
        )
    finally:
        for runner in runners:
            runner.stop()

    print(f"runners                     {args.runners} processes, default settings, PostgreSQL")
    print(
        f"concurrency=4, 200 ms       {busy:.1%} of slots busy, enqueue to drained "
        f"({args.capped_items} items in {wall:.2f}s)"
    )
    print(
        f"  from the attempts         {busy_while_backlog:.1%} busy from first start to last end; "
        f"at most {peak} at once"
    )
    print(
        f"rate_limit=(20, 1)          {rate:.1f} starts/s over {len(starts)} starts ({rate / 20:.1%} of 20)"
    )
    print(f"  most in any 1 s window    {most} (attempt start stamps; in any 0.9 s window: {most_09})")
    print(f"  21 starts span at least   {tightest:.4f} s")
    print(f"unlimited no-op drain       {unlimited:,.0f}/s ({args.drain_items} items)")
    print(f"serial_key, 1,000 keys      {serial:,.0f}/s ({serial / unlimited:.1%} of unlimited)")


if __name__ == "__main__":
    main()

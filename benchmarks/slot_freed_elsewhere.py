"""A full ``concurrency`` kind's slot freed by ANOTHER runner: how late the next row starts.

    .venv/bin/python benchmarks/slot_freed_elsewhere.py [--database-url postgres://…/nw_bench]

Two ``runworkflows`` processes (the limited kinds of ``benchmarks/flowapp``). Each round
enqueues a row of ``bench-single`` (``concurrency=1``) that holds the slot for a second,
then, once one runner runs it, a second row: the other runner finds every slot held and
rests the kind. The holder is stopped (SIGTERM: it finishes its attempt, claims nothing
more), so only the resting runner can start the second row. Prints, over the rounds,
how long after the first row's end (its database stamp) the second started (the start
time it journals; one machine, one clock): median and longest. The stopped runner is
started again for the next round. ``--holder-stays``: nobody is stopped (a baseline: the
holder's own end wakes it).

It is a measurement, not a test: nothing here asserts a speed
(``tests/flow/test_full_kind_wakeups.py`` tests the wake-up).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.deferred_throughput import (  # noqa: E402
    DEFAULT_DATABASE_URL,
    RunnerProcess,
    ensure_postgres_database,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--holder-stays",
        action="store_true",
        help="the holder is not stopped (its own end wakes it): a baseline",
    )
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
    return parser.parse_args()


def wait_until(check: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def main() -> None:
    args = parse_args()
    if args.database_url.startswith("postgres"):
        ensure_postgres_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["BENCH_FLOW"] = "1"  # the runner processes inherit it
    import django

    django.setup()
    from django.core.management import call_command

    from nexus_workflows import enqueue
    from nexus_workflows.models import DeferredWork, Status

    call_command("migrate", verbosity=0)
    DeferredWork.objects.filter(kind__startswith="bench-").delete()
    runners = [RunnerProcess(args.database_url, 2) for _ in range(2)]
    for runner in runners:
        runner.wait_started()
    gaps: list[float] = []
    waits: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        for number in range(args.rounds):
            journal = Path(folder) / f"{number}.log"
            first = enqueue("bench-single", {"key": f"h{number}", "journal": str(journal), "seconds": 1.0})
            wait_until(
                lambda path=journal: path.exists() and path.read_text().strip(), "the first row to start"
            )
            holder_pid = int(journal.read_text().split()[0])
            enqueued = time.time()
            (holder,) = [r for r in runners if r.process.pid == holder_pid]
            second = enqueue("bench-single", {"key": f"n{number}", "journal": str(journal), "seconds": 0.0})
            time.sleep(0.3)  # the other runner asks, finds the slot held and rests the kind
            if not args.holder_stays:
                holder.process.send_signal(15)
            wait_until(
                lambda pk=second: DeferredWork.objects.filter(pk=pk, status=Status.DONE).exists(),
                "the second row",
            )
            ended = DeferredWork.objects.get(pk=first).finished_at
            assert ended is not None
            started = float(journal.read_text().splitlines()[1].split()[1])  # the second row's
            gaps.append((started - ended.timestamp()) * 1000)
            waits.append((started - enqueued) * 1000)
            if args.holder_stays:
                continue
            holder.process.wait(60)
            runners[runners.index(holder)] = replacement = RunnerProcess(args.database_url, 2)
            replacement.wait_started()
    for runner in runners:
        runner.stop()
    print(
        f"slot freed by the other runner -> next row started: median {statistics.median(gaps):.1f} ms, "
        f"longest {max(gaps):.1f} ms over {len(gaps)} rounds"
    )
    print("gaps (ms):", " ".join(f"{g:.0f}" for g in gaps))
    print(
        "(enqueue -> start of that row, incl. the 0.3 s and the holder's attempt: "
        f"median {statistics.median(waits):.0f} ms)"
    )


if __name__ == "__main__":
    main()

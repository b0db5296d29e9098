"""The runner's cost per drained no-op item, two ways the machine's load moves little.

    # CPU time (utime + stime, /proc) of a `runworkflows` process over each drain, this
    # tree's code against another tree's (a worktree of main), alternated in pairs:
    .venv/bin/python benchmarks/drain_costs.py cpu --items 20000 --pairs 3 --against /work/old
    # Python calls per item under cProfile, on every thread of an in-process runner
    # (`--once`), less those of a run that drained nothing:
    .venv/bin/python benchmarks/drain_costs.py calls --items 3000 [--code-root /work/old] [--top 25]

Both use ``DATABASE_URL`` (PostgreSQL by default ``nw_bench``, created if missing) and the
``bench-noop`` workflow; the runner logs as the project's settings say (one INFO line per
state change, on stderr: give ``2>/dev/null`` or a file). A measurement, not a test: nothing
here asserts a speed.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/nw_bench"
KIND = "bench-noop"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("cpu", "calls"))
    parser.add_argument("--items", type=int, default=20_000)
    parser.add_argument("--pairs", type=int, default=3, help="cpu: drains of each tree, alternated")
    parser.add_argument(
        "--against", type=Path, action="append", default=[], help="cpu: another tree (repeatable)"
    )
    parser.add_argument("--code-root", type=Path, default=ROOT, help="calls: the tree whose code runs")
    parser.add_argument("--top", type=int, default=0, help="calls: the functions called most, per item")
    parser.add_argument("--dump", type=Path, default=None, help="calls: the drain's pstats, for pstats")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL))
    return parser.parse_args()


def setup(database_url: str, code_root: Path) -> None:
    sys.path.insert(0, str(code_root))
    if database_url.startswith("postgres"):
        import psycopg
        from psycopg import sql

        name = database_url.rsplit("/", 1)[1]
        with psycopg.connect(database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as connection:
            if not connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fresh_backlog(items: int) -> None:
    """``items`` due no-op items in one commit, on a table cleared of the kind's rows."""
    from django.db import connection, transaction

    from nexus_workflows import enqueue_many
    from nexus_workflows.models import DeferredWork

    DeferredWork.objects.filter(kind=KIND).delete()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE nexus_workflows_deferredwork")
    if items:
        with transaction.atomic():
            enqueue_many(KIND, [{"key": f"drain-{number}"} for number in range(items)])


def unfinished() -> int:
    from nexus_workflows.models import DeferredWork, Status

    return DeferredWork.objects.filter(kind=KIND, status__in=[Status.PENDING, Status.PROCESSING]).count()


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


# --- cpu --------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drain_cpu(tree: Path, items: int, database_url: str) -> tuple[float, float]:
    """One runner process of ``tree`` drains ``items`` enqueued in one commit while it is
    idle; returns (its CPU µs per item, items per second)."""
    from django.db import transaction

    from nexus_workflows import enqueue_many

    fresh_backlog(0)
    log = tempfile.NamedTemporaryFile(prefix="drain-costs-", suffix=".log", delete=False)  # noqa: SIM115
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "benchmarks.settings",
        "DATABASE_URL": database_url,
        "PYTHONPATH": str(tree),
    }
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runworkflows", "--kind", KIND],
        cwd=tree,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while "runner started" not in Path(log.name).read_text():
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"runner did not start:\n{Path(log.name).read_text()}")
            time.sleep(0.05)
        time.sleep(1.0)
        with transaction.atomic():
            enqueue_many(KIND, [{"key": f"drain-{number}"} for number in range(items)])
            before = cpu_seconds(process.pid)
            started = time.perf_counter()
        while unfinished():
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        used = cpu_seconds(process.pid) - before
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        Path(log.name).unlink(missing_ok=True)
    return used / items * 1e6, items / elapsed


def cpu(args: argparse.Namespace) -> None:
    trees = {"this": ROOT, **{f"other{n + 1}": tree.resolve() for n, tree in enumerate(args.against)}}
    print(f"items {args.items} per drain; trees: " + ", ".join(f"{n} {p}" for n, p in trees.items()))
    for pair in range(args.pairs):
        # Alternate which goes first: a load that drifts favours neither.
        order = list(trees.items()) if pair % 2 == 0 else list(reversed(trees.items()))
        for name, tree in order:
            at = load()
            per_item, rate = drain_cpu(tree, args.items, args.database_url)
            print(f"round {pair + 1} {name:6s} {per_item:6.1f} µs/item  {rate:7,.0f}/s  load {at}->{load()}")


# --- calls ------------------------------------------------------------------------------


def profiled_drain(items: int) -> tuple[int, pstats.Stats]:
    """A ``--once`` runner drains ``items`` under cProfile on every thread it starts."""
    from nexus_workflows.deferred.runner import Runner

    fresh_backlog(items)
    profiles: list[cProfile.Profile] = []

    def first_call(*_: Any) -> None:  # a new thread's first event: profile it from here
        profile = cProfile.Profile()
        profiles.append(profile)
        profile.enable()

    main = cProfile.Profile()
    profiles.append(main)
    threading.setprofile(first_call)
    main.enable()
    try:
        done = Runner(once=True, kinds=[KIND], install_signal_handlers=False).run().done
    finally:
        main.disable()
        threading.setprofile(None)
    stats = pstats.Stats(main)
    for profile in profiles[1:]:
        profile.create_stats()  # another thread's: its stats so far (it has ended or idles)
        stats.add(profile)
    return done, stats


def calls(args: argparse.Namespace) -> None:
    _, idle = profiled_drain(0)
    done, drained = profiled_drain(args.items)
    per_item = (drained.total_calls - idle.total_calls) / done  # type: ignore[attr-defined]
    print(f"{args.code_root}: {done} items, {per_item:.1f} Python calls per item (load {load()})")
    if args.dump is not None:
        drained.dump_stats(args.dump)
    if args.top:
        rows = sorted(drained.stats.items(), key=lambda row: -row[1][1])[: args.top]  # type: ignore[attr-defined]
        for (path, line, name), (_, ncalls, tottime, *_rest) in rows:
            where = f"{Path(path).name}:{line}" if line else path
            print(f"{ncalls / done:7.2f}/item  {tottime / done * 1e6:7.1f} µs/item  {name} ({where})")


def main() -> None:
    args = parse_args()
    setup(args.database_url, args.code_root if args.mode == "calls" else ROOT)
    cpu(args) if args.mode == "cpu" else calls(args)


if __name__ == "__main__":
    main()

"""Deferred workflows: enqueue rate, drain rate of one runner, idle enqueue-to-start latency.

    .venv/bin/python benchmarks/deferred_throughput.py                       # PostgreSQL
    .venv/bin/python benchmarks/deferred_throughput.py --database-url sqlite:///$PWD/var/bench.sqlite3

It uses its own database (PostgreSQL ``nw_bench`` by default, created if missing), starts one
``manage.py runworkflows`` process with the project's default settings, and prints figures.
It is a measurement, not a test: nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.children import die_with_parent  # noqa: E402

DEFAULT_DATABASE_URL = "postgres://postgres@127.0.0.1:5432/nw_bench"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--items", type=int, default=10_000, help="items to enqueue and drain (default 10000)"
    )
    parser.add_argument("--latency-samples", type=int, default=50)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL", DEFAULT_DATABASE_URL))
    parser.add_argument("--concurrency", type=int, default=None, help="runner threads (default: the setting)")
    return parser.parse_args()


def ensure_postgres_database(url: str) -> None:
    import psycopg
    from psycopg import sql

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


class RunnerProcess:
    def __init__(self, database_url: str, concurrency: int | None) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="bench-runner-", suffix=".log", delete=False)  # noqa: SIM115
        args = [sys.executable, "manage.py", "runworkflows"]
        if concurrency:
            args += ["--concurrency", str(concurrency)]
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.settings", "DATABASE_URL": database_url}
        self.process = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
        )

    def wait_started(self) -> None:
        deadline = time.monotonic() + 30
        while "runner started" not in Path(self.log.name).read_text():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit(f"runner did not start:\n{Path(self.log.name).read_text()}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        Path(self.log.name).unlink(missing_ok=True)


def _vacuum(connection: Any) -> Any:
    """VACUUM ANALYZE the work table on PostgreSQL (what autovacuum would do)."""

    def vacuum() -> None:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("VACUUM ANALYZE nexus_workflows_deferredwork")

    return vacuum


def main() -> None:
    args = parse_args()
    if args.database_url.startswith("postgres"):
        ensure_postgres_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from nexus_workflows import enqueue
    from nexus_workflows.conf import app_settings
    from nexus_workflows.models import DeferredWork, Status

    call_command("migrate", verbosity=0)
    DeferredWork.objects.filter(kind__startswith="bench-").delete()
    vacuum = _vacuum(connection)
    vacuum()  # a clean start: this machine's PostgreSQL runs with autovacuum off
    items = args.items
    vendor = connection.vendor

    def unfinished() -> int:
        return DeferredWork.objects.filter(
            kind="bench-noop", status__in=[Status.PENDING, Status.PROCESSING]
        ).count()

    # 1. Enqueue one by one (autocommit), no runner competing for the CPU.
    started = time.perf_counter()
    for number in range(items):
        enqueue("bench-noop", {"key": f"one-{number}"})
    enqueue_rate = items / (time.perf_counter() - started)
    DeferredWork.objects.filter(kind="bench-noop").delete()
    vacuum()

    runner = RunnerProcess(args.database_url, args.concurrency)
    try:
        runner.wait_started()
        time.sleep(1.0)

        # 2. Idle enqueue-to-start latency: the runner is idle when each item arrives.
        latencies = []
        for number in range(args.latency_samples):
            before = time.time()
            work_id = enqueue("bench-latency", {"key": f"latency-{number}"})
            deadline = time.monotonic() + 10
            while True:
                work = DeferredWork.objects.filter(pk=work_id).values("status", "checkpoints").get()
                if work["status"] == Status.DONE:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit("latency item not done within 10 s")
                time.sleep(0.005)
            latencies.append((work["checkpoints"]["started"] - before) * 1000)
            time.sleep(0.2)

        # 3. Drain: N items become visible at once (one commit); time until all are done.
        started = time.perf_counter()
        with transaction.atomic():
            for number in range(items):
                enqueue("bench-noop", {"key": f"drain-{number}"})
        in_transaction_rate = items / (time.perf_counter() - started)
        committed = time.perf_counter()
        while unfinished():
            time.sleep(0.01)
        drain_rate = items / (time.perf_counter() - committed)
    finally:
        runner.stop()

    print(f"database            {vendor}")
    print(f"items               {items}")
    print(f"runner concurrency  {args.concurrency or app_settings.CONCURRENCY} threads, 1 process")
    print(f"enqueue one by one  {enqueue_rate:,.0f}/s (autocommit)")
    print(f"enqueue in one tx   {in_transaction_rate:,.0f}/s (savepoint per call)")
    print(f"drain               {drain_rate:,.0f}/s")
    median = statistics.median(latencies)
    p90 = statistics.quantiles(latencies, n=10)[-1]
    print(
        f"idle latency        median {median:.1f} ms, p90 {p90:.1f} ms, "
        f"min {min(latencies):.1f} ms, max {max(latencies):.1f} ms ({len(latencies)} samples)"
    )


if __name__ == "__main__":
    main()

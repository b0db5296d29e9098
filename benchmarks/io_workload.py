"""One cell of the I/O workload (issue 12): jobs that wait 200 ms, as calls out over the
network do, drained by one worker process; prints its figures as one JSON line (last line).

    python benchmarks/io_workload.py SYSTEM --database-url URL --mode sync|async
        --jobs N --concurrency C [--save]

SYSTEM is ``ours`` (the app's ``.venv``) or ``procrastinate`` (``benchmarks/.peers-venv``).
``--mode``: a sync job waits with ``time.sleep`` in a thread, an async one with
``asyncio.sleep`` on the worker's event loop. ``--save`` (ours only): each job journals one
step with ``save()`` after its wait. Protocol:

1. the N jobs are enqueued in one commit, with no worker running;
2. ONE worker process starts with the system's documented command and concurrency C
   (ours: ``runworkflows`` with ``CONCURRENCY`` = C for sync, ``ASYNC_CONCURRENCY`` = C for
   async; Procrastinate: ``procrastinate worker --concurrency C``);
3. while it drains, a connection of this script samples every 20 ms the sessions on the
   database (``pg_stat_activity``, this script's own excluded: it holds no other) and the
   worker's threads and RSS (``/proc``);
4. throughput = N ÷ (last finish - first claim), both as the system records them in the
   database (the first claim: ours ``claimed_at``, read while it is held; Procrastinate's
   first ``started`` event, written by the fetch that claims a job); the ideal is C ÷ 0.2 s.

``benchmarks/compare --sections io`` runs the matrix; this runs one cell.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.children import die_with_parent  # noqa: E402

WAIT = 0.2


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Sampler(threading.Thread):
    """Peak sessions on the database and peak threads and RSS of one process."""

    def __init__(self, database_url: str, pid: int, watcher_pid: int) -> None:
        super().__init__(daemon=True)
        import psycopg

        self.connection = psycopg.connect(database_url, autocommit=True)
        self.pid = pid
        self.watcher_pid = watcher_pid
        self.connections = self.threads = self.rss_kib = 0
        self.stopping = threading.Event()

    def sessions(self) -> int:
        sql = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND pid <> %s"
        )
        return self.connection.execute(sql, [self.watcher_pid]).fetchone()[0]

    def process(self) -> tuple[int, int]:
        threads = rss = 0
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("Threads:"):
                    threads = int(line.split()[1])
                elif line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        except OSError:
            pass
        return threads, rss

    def run(self) -> None:
        while not self.stopping.is_set():
            self.connections = max(self.connections, self.sessions())
            threads, rss = self.process()
            self.threads, self.rss_kib = max(self.threads, threads), max(self.rss_kib, rss)
            self.stopping.wait(0.02)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)


class Worker:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="bench-io-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
        )

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        Path(self.log.name).unlink(missing_ok=True)


class System:
    settings_module = ""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        os.environ["DJANGO_SETTINGS_MODULE"] = self.settings_module
        os.environ["DATABASE_URL"] = options.database_url

    def setup(self) -> None:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def execute(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(sql, params or [])
            return cursor.fetchall() if cursor.description else []

    def env(self) -> dict[str, str]:
        return {**os.environ}

    def versions(self) -> dict[str, str]:
        from importlib.metadata import version

        return {package: version(package) for package in self.packages}

    packages: tuple[str, ...] = ("Django", "psycopg")


class Ours(System):
    settings_module = "benchmarks.settings"

    def kind(self) -> str:
        return f"bench-io-{self.options.mode}"

    def reset(self) -> None:
        from nexus_workflows.models import DeferredWork

        self.execute(f"TRUNCATE {DeferredWork._meta.db_table}")

    def enqueue(self) -> None:
        from nexus_workflows import enqueue_many

        triggers = [{"key": n, "save": self.options.save} for n in range(self.options.jobs)]
        enqueue_many(self.kind(), triggers)  # one transaction

    def worker(self) -> Worker:
        concurrency = self.options.concurrency
        if self.options.mode == "sync":
            settings = {"CONCURRENCY": concurrency}
        else:
            settings = {"ASYNC_CONCURRENCY": concurrency}
        env = {
            **self.env(),
            "BENCH_NEXUS_WORKFLOWS": json.dumps(settings),
            "NEXUS_WORKFLOWS_LOG_LEVEL": "WARNING",
        }
        args = [sys.executable, "manage.py", "runworkflows", "--kind", self.kind()]
        if self.options.mode == "sync":
            args += ["--concurrency", str(concurrency)]
        return Worker(args, env)

    def progress(self, cursor: Any) -> tuple[int, float | None, float | None]:
        """(jobs done, epoch of the earliest claim still held, epoch of the last finish).

        A done row keeps no stamp of its claim or start, so the first claim is read while it
        is held: every job holds its claim for at least ``WAIT`` (200 ms), four polls, and
        :func:`measure` keeps the earliest it saw. Procrastinate's first ``started`` event is
        its claim, too (its fetch marks the job ``doing``), so both are timed alike."""
        return cursor.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), extract(epoch FROM min(claimed_at)), "
            "extract(epoch FROM max(finished_at)) FROM nexus_workflows_deferredwork WHERE kind = %s",
            [self.kind()],
        ).fetchone()


class Procrastinate(System):
    settings_module = "benchmarks.peers.procrastinate_project.settings"
    packages = ("Django", "psycopg", "procrastinate")

    def task_name(self) -> str:
        return f"bench_io_{self.options.mode}"

    def reset(self) -> None:
        self.execute("TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE")

    def enqueue(self) -> None:
        from django.db import transaction

        from benchmarks.peers.procrastinate_project import tasks

        task = tasks.io_sync if self.options.mode == "sync" else tasks.io_async
        with transaction.atomic():
            task.batch_defer(*({"key": str(n)} for n in range(self.options.jobs)))

    def worker(self) -> Worker:
        manage = ROOT / "benchmarks/peers/procrastinate_project/manage.py"
        args = [sys.executable, str(manage), "procrastinate", "worker"]
        args += ["--concurrency", str(self.options.concurrency)]
        return Worker(args, self.env())

    def progress(self, cursor: Any) -> tuple[int, float | None, float | None]:
        return cursor.execute(
            "SELECT (SELECT count(*) FROM procrastinate_jobs WHERE task_name = %s AND status = 'succeeded'), "
            "extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'started')), "
            "extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'succeeded')) "
            "FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id WHERE j.task_name = %s",
            [self.task_name(), self.task_name()],
        ).fetchone()


def measure(system: Ours | Procrastinate, options: argparse.Namespace) -> dict[str, Any]:
    import psycopg
    from django.db import connection

    system.setup()
    system.reset()
    system.enqueue()
    connection.close()  # from here on, the watcher and the sampler are this script's sessions
    watcher = psycopg.connect(options.database_url, autocommit=True)
    worker = system.worker()
    sampler = Sampler(options.database_url, worker.process.pid, watcher.info.backend_pid)
    sampler.start()
    began = time.monotonic()
    # Whatever the concurrency, at least 10 jobs/s (a peer's thread pool may cap it).
    timeout = options.jobs / 10 + 120
    try:
        with watcher:
            first: float | None = None
            while True:
                done, claimed, last = system.progress(watcher)
                if claimed is not None:
                    first = float(claimed) if first is None else min(first, float(claimed))
                if done >= options.jobs:
                    break
                if worker.process.poll() is not None:
                    raise SystemExit(f"the worker exited:\n{worker.output()[-3000:]}")
                if time.monotonic() - began > timeout:
                    raise SystemExit(
                        f"timed out with {done} of {options.jobs} done:\n{worker.output()[-3000:]}"
                    )
                time.sleep(0.05)
    finally:
        sampler.stop()
        worker.stop()
    if first is None:
        raise SystemExit("no claim was seen while the jobs ran: the first start is unknown")
    seconds = float(last) - first
    per_s = options.jobs / seconds
    ideal = options.concurrency / WAIT
    result = {
        "system": options.system,
        "mode": options.mode,
        "save": options.save,
        "jobs": options.jobs,
        "concurrency": options.concurrency,
        "seconds": seconds,
        "jobs_per_s": per_s,
        "of_ideal": per_s / ideal,
        "peak_connections": sampler.connections,
        "peak_threads": sampler.threads,
        "peak_rss_mib": sampler.rss_kib / 1024,
        "versions": system.versions(),
    }
    system.reset()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("system", choices=("ours", "procrastinate"))
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--mode", choices=("sync", "async"), required=True)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--save", action="store_true")
    options = parser.parse_args()
    system = Ours(options) if options.system == "ours" else Procrastinate(options)
    log(
        f"{options.system} {options.mode}{' +save' if options.save else ''}: {options.jobs} jobs, "
        f"concurrency {options.concurrency}"
    )
    print(json.dumps(measure(system, options)))


if __name__ == "__main__":
    main()

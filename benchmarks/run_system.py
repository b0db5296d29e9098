"""One measured run of one job system; prints its figures as one JSON line (last line).

    python benchmarks/run_system.py SYSTEM --database-url URL [--items N] [--latency-samples S]

SYSTEM is ``ours`` or ``ours-tasks`` (run with the app's ``.venv``), ``django-tasks`` or
``procrastinate`` (run with ``benchmarks/.peers-venv``). ``ours-tasks`` and ``django-tasks`` run
the same ``@task`` module (``benchmarks/tasks.py``) on our backend and on django-tasks-db's.
``benchmarks/compare`` runs this for every system in turn; it can also be run alone. Every
system goes through the same protocol (:func:`measure`):

1. enqueue N no-op jobs one by one (autocommit, no worker running);
2. enqueue N at once through the system's bulk API, where it has one (no worker running);
3. start ONE worker process with the system's documented command and wait until it has run a
   first job;
4. idle enqueue-to-start latency: with the worker idle (0.2-1.2 s after the previous job, at
   random), enqueue a job whose first statement takes ``time.time()``; latency = that time
   minus the time just before the enqueue call (so it includes the enqueue's own commit);
   it is also reported in two parts: the enqueue call itself, and from its return to the start;
5. drain: N no-op jobs become visible in one commit; drain time = the last job's finish time
   (as the system records it in the database) minus the time the commit returned.

It drops the system's jobs (TRUNCATE) before each step, in its own database.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.children import die_with_parent  # noqa: E402


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class WorkerProcess:
    """One worker process whose output goes to a temporary file."""

    def __init__(self, args: list[str], *, env: dict[str, str], cwd: Path) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="bench-worker-", suffix=".log", delete=False)  # noqa: SIM115
        self.process = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
        )

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise SystemExit(f"the worker exited with {self.process.returncode}:\n{self.output()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        Path(self.log.name).unlink(missing_ok=True)


def wait_for(
    condition: Callable[[], Any], *, timeout: float, every: float, what: str, worker: WorkerProcess
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        worker.check_alive()
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}:\n{worker.output()[-3000:]}")
        time.sleep(every)


# --- The systems ------------------------------------------------------------------------


class System:
    """What the protocol needs from a job system; subclasses import their package lazily,
    since each system runs in its own virtualenv."""

    name = ""
    settings_module = ""
    has_bulk = False

    def __init__(self, database_url: str, options: argparse.Namespace) -> None:
        self.database_url = database_url
        self.options = options

    def setup(self) -> None:
        os.environ["DJANGO_SETTINGS_MODULE"] = self.settings_module
        os.environ["DATABASE_URL"] = self.database_url
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)

    def execute(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(sql, params or [])
            return cursor.fetchall() if cursor.description else []

    def scalar(self, sql: str, params: list[Any] | None = None) -> Any:
        return self.execute(sql, params)[0][0]

    def versions(self) -> dict[str, str]:
        from importlib.metadata import version

        return {package: version(package) for package in ("Django", "psycopg", *self.packages())}

    def packages(self) -> tuple[str, ...]:
        return ()

    def worker(self) -> WorkerProcess:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def enqueue_one(self, key: str) -> None:
        raise NotImplementedError

    def enqueue_bulk(self, keys: list[str]) -> None:
        raise NotImplementedError

    def enqueue_in_one_commit(self, keys: list[str]) -> None:
        raise NotImplementedError

    def enqueue_probe(self, key: str) -> Any:
        raise NotImplementedError

    def probe_started(self, handle: Any) -> float | None:
        raise NotImplementedError

    def unfinished(self) -> int:
        raise NotImplementedError

    def finished(self) -> tuple[int, int, float | None]:
        """(succeeded, failed, epoch time of the last finish) for the no-op jobs."""
        raise NotImplementedError

    def extras(self) -> dict[str, Any]:
        return {}

    def worker_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": self.settings_module,
            "DATABASE_URL": self.database_url,
        }


class Ours(System):
    """nexus_workflows: ``enqueue`` / ``enqueue_many``, ``manage.py runworkflows`` with the
    project's default settings (CONCURRENCY 4 threads, LISTEN/NOTIFY wake-up)."""

    name = "ours"
    settings_module = "benchmarks.settings"
    has_bulk = True

    def packages(self) -> tuple[str, ...]:
        return ()

    def setup(self) -> None:
        super().setup()
        from nexus_workflows.models import DeferredWork

        self.table = DeferredWork._meta.db_table

    def worker(self) -> WorkerProcess:
        self._worker = WorkerProcess(
            [sys.executable, "manage.py", "runworkflows"], env=self.worker_env(), cwd=ROOT
        )
        return self._worker

    def reset(self) -> None:
        self.execute(f"TRUNCATE {self.table}")

    def enqueue_one(self, key: str) -> None:
        from nexus_workflows import enqueue

        enqueue("bench-noop", {"key": key})

    def enqueue_bulk(self, keys: list[str]) -> None:
        from nexus_workflows import enqueue_many

        enqueue_many("bench-noop", [{"key": key} for key in keys])

    def enqueue_in_one_commit(self, keys: list[str]) -> None:
        self.enqueue_bulk(keys)  # one transaction

    def enqueue_probe(self, key: str) -> Any:
        from nexus_workflows import enqueue

        return enqueue("bench-latency", {"key": key})

    def probe_started(self, handle: Any) -> float | None:
        rows = self.execute(f"SELECT checkpoints->>'started' FROM {self.table} WHERE id = %s", [int(handle)])
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    def unfinished(self) -> int:
        return self.scalar(
            f"SELECT count(*) FROM {self.table} WHERE kind = 'bench-noop' "
            "AND status IN ('pending', 'processing')"
        )

    def finished(self) -> tuple[int, int, float | None]:
        done, abandoned, last = self.execute(
            f"SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'abandoned'), "
            f"extract(epoch FROM max(updated_at) FILTER (WHERE status = 'done')) "
            f"FROM {self.table} WHERE kind = 'bench-noop'"
        )[0]
        return done, abandoned, float(last) if last is not None else None

    def extras(self) -> dict[str, Any]:
        # Each batch of finished work is written by one UPDATE with one updated_at.
        batches = self.scalar(
            f"SELECT count(DISTINCT updated_at) FROM {self.table} "
            "WHERE kind = 'bench-noop' AND status = 'done'"
        )
        # The runner's start line says how it learns of new work (wake-ups: listening,
        # short-poll when its probe NOTIFY did not arrive, ...).
        mode = re.search(r"wake-ups: ([\w-]+)", self._worker.output())
        return {"done_batches": batches, "wakeup_mode": mode.group(1) if mode else None}


class OursTasks(System):
    """Django's Tasks API on nexus_workflows: the ``@task`` module of ``benchmarks/tasks.py``
    enqueued with ``Task.enqueue`` on ``nexus_workflows.tasks.DeferredBackend`` and run by
    ``manage.py runworkflows`` (the project's defaults, as for ``ours``)."""

    name = "ours-tasks"
    settings_module = "benchmarks.settings"

    def setup(self) -> None:
        super().setup()
        from nexus_workflows.models import DeferredWork

        self.table = DeferredWork._meta.db_table

    def packages(self) -> tuple[str, ...]:
        import django

        return () if django.VERSION >= (6, 0) else ("django-tasks",)

    def worker(self) -> WorkerProcess:
        return WorkerProcess([sys.executable, "manage.py", "runworkflows"], env=self.worker_env(), cwd=ROOT)

    def reset(self) -> None:
        self.execute(f"TRUNCATE {self.table}")

    def enqueue_one(self, key: str) -> None:
        from benchmarks.tasks import noop

        noop.enqueue(key=key)

    def enqueue_in_one_commit(self, keys: list[str]) -> None:
        from django.db import transaction

        from benchmarks.tasks import noop

        with transaction.atomic():
            for key in keys:
                noop.enqueue(key=key)

    def enqueue_probe(self, key: str) -> Any:
        from benchmarks.tasks import stamp

        return stamp.enqueue(key=key).id

    def probe_started(self, handle: Any) -> float | None:
        rows = self.execute(
            f"SELECT return_value FROM {self.table} WHERE dedupe_key = %s AND queue_name <> '' "
            "AND status = 'done'",
            [handle],
        )
        return float(rows[0][0]) if rows else None

    def unfinished(self) -> int:
        return self.scalar(
            f"SELECT count(*) FROM {self.table} WHERE kind = 'benchmarks.tasks.noop' "
            "AND status IN ('pending', 'processing')"
        )

    def finished(self) -> tuple[int, int, float | None]:
        done, abandoned, last = self.execute(
            "SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'abandoned'), "
            f"extract(epoch FROM max(finished_at)) FROM {self.table} WHERE kind = 'benchmarks.tasks.noop'"
        )[0]
        return done, abandoned, float(last) if last is not None else None


class DjangoTasks(System):
    """django-tasks with django-tasks-db: ``Task.enqueue``, ``manage.py db_worker`` with its
    defaults (``--interval 1``: it polls once a second when idle; one task at a time)."""

    name = "django-tasks"
    settings_module = "benchmarks.peers.django_tasks_project.settings"
    table = "django_tasks_database_dbtaskresult"

    def packages(self) -> tuple[str, ...]:
        return ("django-tasks", "django-tasks-db")

    def worker(self) -> WorkerProcess:
        manage = ROOT / "benchmarks/peers/django_tasks_project/manage.py"
        return WorkerProcess([sys.executable, str(manage), "db_worker"], env=self.worker_env(), cwd=ROOT)

    def reset(self) -> None:
        self.execute(f"TRUNCATE {self.table}")

    def enqueue_one(self, key: str) -> None:
        from benchmarks.tasks import noop

        noop.enqueue(key=key)

    def enqueue_in_one_commit(self, keys: list[str]) -> None:
        from django.db import transaction

        from benchmarks.tasks import noop

        with transaction.atomic():
            for key in keys:
                noop.enqueue(key=key)

    def enqueue_probe(self, key: str) -> Any:
        from benchmarks.tasks import stamp

        return stamp.enqueue(key=key).id

    def probe_started(self, handle: Any) -> float | None:
        rows = self.execute(
            f"SELECT return_value FROM {self.table} WHERE id = %s AND status = 'SUCCESSFUL'", [handle]
        )
        return float(rows[0][0]) if rows else None

    def unfinished(self) -> int:
        return self.scalar(
            f"SELECT count(*) FROM {self.table} WHERE task_path LIKE '%%.noop' "
            "AND status IN ('READY', 'RUNNING')"
        )

    def finished(self) -> tuple[int, int, float | None]:
        done, failed, last = self.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
            "count(*) FILTER (WHERE status = 'FAILED'), "
            f"extract(epoch FROM max(finished_at)) FROM {self.table} WHERE task_path LIKE '%%.noop'"
        )[0]
        return done, failed, float(last) if last is not None else None


class Procrastinate(System):
    """Procrastinate's Django integration: ``Task.defer`` / ``batch_defer`` through Django's
    connection, ``manage.py procrastinate worker`` (LISTEN/NOTIFY; ``--concurrency`` as
    given, default 1); the tasks are sync functions, run in the worker's threads."""

    name = "procrastinate"
    settings_module = "benchmarks.peers.procrastinate_project.settings"
    has_bulk = True

    def packages(self) -> tuple[str, ...]:
        return ("procrastinate",)

    def setup(self) -> None:
        super().setup()
        from benchmarks.peers.procrastinate_project.tasks import PROBE_TABLE

        self.execute(
            f"CREATE TABLE IF NOT EXISTS {PROBE_TABLE} (key text PRIMARY KEY, started double precision)"
        )

    def worker(self) -> WorkerProcess:
        manage = ROOT / "benchmarks/peers/procrastinate_project/manage.py"
        args = [sys.executable, str(manage), "procrastinate", "worker"]
        args += ["--concurrency", str(self.options.procrastinate_concurrency)]
        return WorkerProcess(args, env=self.worker_env(), cwd=ROOT)

    def reset(self) -> None:
        from benchmarks.peers.procrastinate_project.tasks import PROBE_TABLE

        self.execute(
            f"TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers, {PROBE_TABLE} CASCADE"
        )

    def enqueue_one(self, key: str) -> None:
        from benchmarks.peers.procrastinate_project.tasks import noop

        noop.defer(key=key)

    def enqueue_bulk(self, keys: list[str]) -> None:
        from benchmarks.peers.procrastinate_project.tasks import noop

        noop.batch_defer(*({"key": key} for key in keys))

    def enqueue_in_one_commit(self, keys: list[str]) -> None:
        from django.db import transaction

        with transaction.atomic():
            self.enqueue_bulk(keys)

    def enqueue_probe(self, key: str) -> Any:
        from benchmarks.peers.procrastinate_project.tasks import stamp

        stamp.defer(key=key)
        return key

    def probe_started(self, handle: Any) -> float | None:
        from benchmarks.peers.procrastinate_project.tasks import PROBE_TABLE

        rows = self.execute(f"SELECT started FROM {PROBE_TABLE} WHERE key = %s", [handle])
        return float(rows[0][0]) if rows else None

    def unfinished(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM procrastinate_jobs "
            "WHERE task_name = 'bench_noop' AND status IN ('todo', 'doing')"
        )

    def finished(self) -> tuple[int, int, float | None]:
        done, failed = self.execute(
            "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status = 'failed') "
            "FROM procrastinate_jobs WHERE task_name = 'bench_noop'"
        )[0]
        last = self.scalar(
            "SELECT extract(epoch FROM max(e.at)) FROM procrastinate_events e "
            "JOIN procrastinate_jobs j ON j.id = e.job_id "
            "WHERE j.task_name = 'bench_noop' AND e.type = 'succeeded'"
        )
        return done, failed, float(last) if last is not None else None


SYSTEMS: dict[str, type[System]] = {cls.name: cls for cls in (Ours, OursTasks, DjangoTasks, Procrastinate)}


# --- The protocol -------------------------------------------------------------------------


def assert_alone(scalar: Callable[[str], Any]) -> None:
    """A leftover worker on the benchmark's database would take jobs and skew every figure."""
    others = scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    if others:
        raise SystemExit(
            f"{others} other connection(s) to the benchmark's database: stop whatever uses it "
            "(a leftover worker?) and run again"
        )


def measure(system: System, items: int, latency_samples: int) -> dict[str, Any]:
    system.setup()
    assert_alone(system.scalar)
    result: dict[str, Any] = {"system": system.name, "items": items, "versions": system.versions()}

    system.reset()
    log(f"{system.name}: enqueue {items} one by one")
    started = time.perf_counter()
    for number in range(items):
        system.enqueue_one(f"one-{number}")
    result["enqueue_per_s"] = items / (time.perf_counter() - started)

    if system.has_bulk:
        system.reset()
        keys = [f"bulk-{number}" for number in range(items)]
        log(f"{system.name}: enqueue {items} in one bulk call")
        started = time.perf_counter()
        system.enqueue_bulk(keys)
        result["bulk_enqueue_per_s"] = items / (time.perf_counter() - started)

    system.reset()
    worker = system.worker()
    try:
        handle = system.enqueue_probe("warm-up")
        wait_for(
            lambda: system.probe_started(handle), timeout=60, every=0.05, what="the first job", worker=worker
        )

        log(f"{system.name}: {latency_samples} idle latency samples")
        latencies, enqueue_calls, pickups = [], [], []
        pause = random.Random(7)
        for number in range(latency_samples):
            # The worker is idle when the job arrives; the random pause keeps the arrivals
            # out of step with a polling worker's cycle (django-tasks polls every second).
            time.sleep(pause.uniform(0.2, 1.2))
            before = time.time()
            handle = system.enqueue_probe(f"latency-{number}")
            returned = time.time()
            # The probe's own start time is the measurement; polling only collects it, and
            # starts late so as not to compete for the CPU with the job being started.
            time.sleep(0.05)
            started_at = wait_for(
                lambda handle=handle: system.probe_started(handle),
                timeout=30,
                every=0.01,
                what="a latency probe",
                worker=worker,
            )
            latencies.append((started_at - before) * 1000)
            enqueue_calls.append((returned - before) * 1000)
            pickups.append((started_at - returned) * 1000)
        result["latency_ms"] = latencies
        result["latency_median_ms"] = statistics.median(latencies)
        # The two halves: the enqueue call's own commit (the same kind of INSERT and NOTIFY
        # in every system), and the worker's part from its return to the job's start.
        result["latency_enqueue_median_ms"] = statistics.median(enqueue_calls)
        result["latency_pickup_median_ms"] = statistics.median(pickups)

        keys = [f"drain-{number}" for number in range(items)]
        log(f"{system.name}: drain {items}")
        system.enqueue_in_one_commit(keys)
        committed = time.time()
        wait_for(
            lambda: system.unfinished() == 0,
            timeout=items / 20 + 120,
            every=0.05,
            what="the drain",
            worker=worker,
        )
        polled_end = time.time()
        succeeded, failed, last = system.finished()
        if succeeded != items or last is None:
            raise SystemExit(f"{system.name}: {succeeded} of {items} succeeded, {failed} failed")
        result["drain_seconds"] = last - committed
        result["drain_per_s"] = items / (last - committed)
        result["drain_polled_seconds"] = polled_end - committed
        result.update(system.extras())
    finally:
        worker.stop()
    system.reset()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("system", choices=sorted(SYSTEMS))
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--latency-samples", type=int, default=30)
    parser.add_argument("--procrastinate-concurrency", type=int, default=1)
    parser.add_argument(
        "--wakeup-database-url",
        default="",
        help="ours only: NEXUS_WORKFLOWS['WAKEUP_DATABASE'] points at this URL (a direct "
        "connection while --database-url goes through a pooler)",
    )
    options = parser.parse_args()
    if options.wakeup_database_url:
        os.environ["WAKEUP_DATABASE_URL"] = options.wakeup_database_url
    system = SYSTEMS[options.system](options.database_url, options)
    result = measure(system, options.items, options.latency_samples)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

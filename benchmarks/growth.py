"""How the cost of nexus_workflows grows with the work; prints one JSON line (last line).

    .venv/bin/python benchmarks/growth.py SECTION --database-url URL [options]

Sections (``benchmarks/compare`` runs them all):

* ``scaling``: drain rate with 1, 2 and 4 ``runworkflows`` processes (N items made visible in one
  commit, time until the last is done).
* ``growth``: with 0, 100,000 and 1,000,000 retained ``done`` rows in the table (inserted with
  ``generate_series``, then ``VACUUM ANALYZE`` as autovacuum would), the due-work query
  (``EXPLAIN ANALYZE`` of the claim's SELECT, and the ORM query timed) and the drain of 1,000
  items by one runner.
* ``purge``: 1,000,000 expired ``done`` rows and a backlog of pending work; one runner drains the
  backlog while it purges. The longest stall is the largest gap between two consecutive writes of
  finished work (the runner writes each finished batch with one ``UPDATE``, one ``updated_at``):
  that gap is one turn of the runner's loop, purge batch included.
* ``limit``: the machine's single-row ``UPDATE`` (and ``INSERT``) transactions per second through
  psycopg, autocommit, one connection; ``enqueue()`` against that INSERT, interleaved in one
  process (Django's default options and prepared statements, with and without a waiting
  runner); and the floor of an idle enqueue-to-start, the simplest worker there can be
  (``floor-worker``, a process of its own) measured with the latency protocol.

It uses its own database, which it empties first. Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.run_system import WorkerProcess, assert_alone, log, wait_for  # noqa: E402

TABLE = "nexus_workflows_deferredwork"
COLUMNS = (
    "kind, dedupe_key, trigger, checkpoints, status, attempt, next_attempt_at, claim_token, "
    "last_error, history, created_at, updated_at, priority, queue_name, backend_name, worker_ids, "
    "errors, lost_unstarted"
)


def setup(database_url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def execute(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall() if cursor.description else []


def scalar(sql: str, params: list[Any] | None = None) -> Any:
    return execute(sql, params)[0][0]


def runner() -> WorkerProcess:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "benchmarks.settings"}
    return WorkerProcess([sys.executable, "manage.py", "runworkflows"], env=env, cwd=ROOT)


def wait_started(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        wait_for(
            lambda worker=worker: "runner started" in worker.output(),
            timeout=60,
            every=0.05,
            what="the runner to start",
            worker=worker,
        )


def warm_up(workers: list[WorkerProcess], name: str) -> None:
    """One drain that is not counted: a runner sizes its claims after its first items."""
    drain([f"{name}-{number}" for number in range(200 * len(workers))], workers=workers)


def insert_rows(count: int, *, prefix: str, status: str, age: str) -> float:
    """Insert ``count`` rows of bench-noop with one statement; returns the seconds it took."""
    started = time.perf_counter()
    execute(
        f"INSERT INTO {TABLE} ({COLUMNS}) "
        f"SELECT 'bench-noop', %s || g, jsonb_build_object('key', %s || g), '{{}}', %s, 0, "
        f"now() - interval %s, '', '', '[]', now() - interval %s, now() - interval %s, "
        f"0, '', '', '[]', '[]', 0 "
        f"FROM generate_series(1, %s) AS g",
        [prefix, prefix, status, age, age, age, count],
    )
    return time.perf_counter() - started


def vacuum_analyze() -> float:
    started = time.perf_counter()
    execute(f"VACUUM ANALYZE {TABLE}")
    return time.perf_counter() - started


def drain(keys: list[str], *, workers: list[WorkerProcess]) -> dict[str, Any]:
    """Make ``keys`` visible in one commit; wait until all are done; rate from the DB's clock."""
    from nexus_workflows import enqueue_many

    prefix = keys[0].rsplit("-", 1)[0] + "-"
    enqueue_many("bench-noop", [{"key": key} for key in keys])
    committed = time.time()
    # Two counts, each served by its partial index (nw_due_idx, nw_stale_idx), so that polling
    # stays cheap however many finished rows the table holds.
    unfinished = (
        f"SELECT (SELECT count(*) FROM {TABLE} WHERE status = 'pending') "
        f"+ (SELECT count(*) FROM {TABLE} WHERE status = 'processing')"
    )
    wait_for(
        lambda: scalar(unfinished) == 0,
        timeout=len(keys) / 50 + 60,
        every=0.02,
        what="the drain",
        worker=workers[0],
    )
    done, last, batches = execute(
        f"SELECT count(*), extract(epoch FROM max(updated_at)), count(DISTINCT updated_at) FROM {TABLE} "
        f"WHERE status = 'done' AND dedupe_key LIKE %s",
        [prefix + "%"],
    )[0]
    if done != len(keys):
        raise SystemExit(f"{done} of {len(keys)} done")
    seconds = float(last) - committed
    return {"seconds": seconds, "per_s": len(keys) / seconds, "done_batches": batches}


# --- Sections -------------------------------------------------------------------------------


def scaling(options: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for processes in (1, 2, 4):
        execute(f"TRUNCATE {TABLE}")
        log(f"scaling: {processes} runworkflows process(es)")
        workers = [runner() for _ in range(processes)]
        try:
            wait_started(workers)
            warm_up(workers, f"warm{processes}")
            rates = []
            for run in range(options.runs):
                keys = [f"scale{processes}r{run}-{number}" for number in range(options.items)]
                rates.append(drain(keys, workers=workers)["per_s"])
                time.sleep(0.5)
        finally:
            for worker in workers:
                worker.stop()
        results[str(processes)] = rates
    execute(f"TRUNCATE {TABLE}")
    return {"items": options.items, "drain_per_s": results}


def due_query_cost(runs: int = 30) -> dict[str, Any]:
    """The claim's SELECT, exactly as the runner builds it, with the pending work present."""
    from django.db import connection
    from django.utils import timezone

    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.deferred.registry import registry
    from nexus_workflows.models import DeferredWork

    claimer = Claimer(kinds=registry.kinds(deferred=True), queues=None, using="default")
    now = timezone.now()

    def query() -> Any:
        # As Claimer.claim_due builds it: its kinds and every task queue, priority first.
        due = DeferredWork.objects.due(now).filter(claimer._selection())
        return due.order_by("-priority", "next_attempt_at").values_list("pk", flat=True)[:100]

    sql, params = query().query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        plan = [row[0] for row in cursor.fetchall()]
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        list(query())
        timings.append((time.perf_counter() - started) * 1000)
    execution = next(float(line.split()[2]) for line in plan if line.startswith("Execution Time"))
    return {
        "explain_execution_ms": execution,
        "plan": plan,
        "orm_query_ms_median": statistics.median(timings),
        "uses_due_index": any("nw_due_idx" in line for line in plan),
    }


def growth(options: argparse.Namespace) -> dict[str, Any]:
    from nexus_workflows import enqueue_many

    execute(f"TRUNCATE {TABLE}")
    results = []
    retained = 0
    for size in options.sizes:
        step: dict[str, Any] = {"retained_done_rows": size}
        if size > retained:
            log(f"growth: inserting {size - retained} retained done rows")
            step["insert_seconds"] = insert_rows(
                size - retained, prefix=f"retained{size}-", status="done", age="1 minute"
            )
            retained = size
        step["vacuum_analyze_seconds"] = vacuum_analyze()
        step["table_mb"] = float(scalar(f"SELECT pg_total_relation_size('{TABLE}') / 1e6"))
        # The due-work query with 1,000 pending items present, the runner stopped.
        enqueue_many("bench-noop", [{"key": f"due{size}-{number}"} for number in range(1000)])
        execute(f"ANALYZE {TABLE}")
        step["due_query"] = due_query_cost()
        execute(f"DELETE FROM {TABLE} WHERE dedupe_key LIKE %s", [f"due{size}-%"])
        log(f"growth: drain {options.items} with {size} retained rows")
        workers = [runner()]
        try:
            wait_started(workers)
            warm_up(workers, f"warm{size}")
            step["drains"] = []
            for run in range(options.runs):
                keys = [f"grow{size}r{run}-{number}" for number in range(options.items)]
                step["drains"].append(drain(keys, workers=workers))
                time.sleep(0.5)
        finally:
            workers[0].stop()
        step["drain_per_s_median"] = statistics.median(d["per_s"] for d in step["drains"])
        results.append(step)
    execute(f"TRUNCATE {TABLE}")
    return {"items": options.items, "steps": results}


def purge(options: argparse.Namespace) -> dict[str, Any]:
    from nexus_workflows.conf import app_settings

    retention = int(app_settings.RETENTION)
    execute(f"TRUNCATE {TABLE}")
    log(f"purge: inserting {options.expired} expired done rows and a backlog of {options.backlog}")
    result: dict[str, Any] = {
        "expired_rows": options.expired,
        "backlog": options.backlog,
        "purge_batch_size": app_settings.PURGE_BATCH_SIZE,
    }
    result["insert_expired_seconds"] = insert_rows(
        options.expired, prefix="expired-", status="done", age=f"{retention + 3600} seconds"
    )
    result["insert_backlog_seconds"] = insert_rows(
        options.backlog, prefix="backlog-", status="pending", age="1 second"
    )
    result["vacuum_analyze_seconds"] = vacuum_analyze()
    # What one purge batch costs the runner's loop, timed alone on the full table.
    from nexus_workflows.deferred.retention import purge_batch

    batches = []
    for _ in range(options.timed_batches):
        began = time.perf_counter()
        purge_batch()
        batches.append((time.perf_counter() - began) * 1000)
    result["timed_batches"] = len(batches)
    result["purge_batch_ms_median"] = statistics.median(batches) if batches else None
    result["purge_batch_ms_max"] = max(batches) if batches else None
    expired_left = (
        f"SELECT count(*) FROM (SELECT 1 FROM {TABLE} WHERE status IN ('done', 'abandoned') "
        f"AND updated_at < now() - interval '{retention} seconds' LIMIT 1) AS one"
    )
    log("purge: one runner drains the backlog while it purges")
    worker = runner()
    try:
        wait_started([worker])
        started = time.time()  # the runner purges from its first turn on
        wait_for(
            lambda: scalar(expired_left) == 0,
            timeout=options.timeout,
            every=0.25,
            what="the purge",
            worker=worker,
        )
        purged = time.time()
    finally:
        worker.stop()
    result["purge_seconds"] = purged - started
    rows = execute(
        f"SELECT extract(epoch FROM updated_at), count(*) FROM {TABLE} "
        f"WHERE status = 'done' AND dedupe_key LIKE 'backlog-%%' AND updated_at <= to_timestamp(%s) "
        f"GROUP BY updated_at ORDER BY updated_at",
        [purged],
    )
    stamps = [float(row[0]) for row in rows]
    drained = sum(row[1] for row in rows)
    gaps = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    result["backlog_left_at_end"] = scalar(
        f"SELECT count(*) FROM {TABLE} WHERE dedupe_key LIKE 'backlog-%%' AND status = 'pending'"
    )
    result["drained_during_purge"] = drained
    result["drain_per_s_during_purge"] = drained / (stamps[-1] - started) if stamps else 0.0
    result["first_done_after_start_seconds"] = stamps[0] - started if stamps else None
    result["done_writes"] = len(stamps)
    result["longest_gap_ms"] = max(gaps) * 1000 if gaps else None
    result["longest_gaps_ms"] = [gap * 1000 for gap in sorted(gaps)[-5:]]
    result["p99_gap_ms"] = statistics.quantiles(gaps, n=100)[-1] * 1000 if len(gaps) >= 100 else None
    result["median_gap_ms"] = statistics.median(gaps) * 1000 if gaps else None
    execute(f"TRUNCATE {TABLE}")
    return result


def limit(options: argparse.Namespace) -> dict[str, Any]:
    import psycopg

    url = options.database_url
    result: dict[str, Any] = {"seconds_each": options.seconds}
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DROP TABLE IF EXISTS bench_limit")
        connection.execute("CREATE TABLE bench_limit (id bigserial PRIMARY KEY, n bigint NOT NULL)")
        connection.execute("INSERT INTO bench_limit (n) SELECT 0 FROM generate_series(1, 1000)")
        connection.execute("VACUUM ANALYZE bench_limit")

        def rate(sql: str, params: Any) -> float:
            count = 0
            started = time.perf_counter()
            deadline = started + options.seconds
            while time.perf_counter() < deadline:
                for _ in range(100):
                    connection.execute(sql, params(count))
                    count += 1
            return count / (time.perf_counter() - started)

        result["select_1_per_s"] = rate("SELECT 1", lambda n: None)
        result["update_per_s"] = rate(
            "UPDATE bench_limit SET n = n + 1 WHERE id = %s", lambda n: [n % 1000 + 1]
        )
        result["insert_per_s"] = rate("INSERT INTO bench_limit (n) VALUES (%s)", lambda n: [n])
        result.update(enqueue_shares(options, connection))
        result.update(idle_floor(options, connection))
        connection.execute("DROP TABLE bench_limit")
    return result


RAW_INSERT = "INSERT INTO bench_limit (n) VALUES (%s)"
ENQUEUE_CELLS = (
    "raw INSERT",
    "its INSERT alone",
    "its INSERT alone, prepared",
    "default",
    "prepared",
    "default, a runner waits",
    "prepared, a runner waits",
)


def enqueue_shares(options: argparse.Namespace, connection: Any) -> dict[str, Any]:
    """``enqueue()`` one by one against the raw INSERT, interleaved in one process (rounds of
    100 calls per cell, so that drift in the machine's speed touches every cell alike): on
    Django's default connection options and on prepared statements (the README's opt-in),
    while no runner waits (no ``NOTIFY``, as in the compare section's enqueue phase) and
    while one does (a connection LISTENs holding the waiting lock, as an idle runner's). And
    the app's own INSERT statement with its parameters on bare psycopg, as Django binds it
    (client-side) and prepared: what the statement costs without any layer above it."""
    import psycopg

    setup(options.database_url)
    from django.db import connections
    from django.test import override_settings
    from django.utils import timezone

    from benchmarks.routers import WorkTo
    from nexus_workflows import enqueue
    from nexus_workflows.deferred.inserts import one_row_statement
    from nexus_workflows.deferred.wakeup import CHANNEL
    from nexus_workflows.sql import postgresql

    execute(f"TRUNCATE {TABLE}")
    micros: dict[str, list[float]] = {cell: [] for cell in ENQUEUE_CELLS}
    router = WorkTo()

    def timed(cell: str, call: Any) -> None:
        started = time.perf_counter()
        for number in range(100):
            call(number)
        micros[cell].append((time.perf_counter() - started) / 100 * 1e6)

    def enqueue_on(alias: str | None, cell: str, turn: int) -> None:
        router.alias = alias
        timed(cell, lambda number: enqueue("bench-noop", {"key": f"{cell}-{turn}-{number}"}))

    def insert_alone(on: Any, cell: str, turn: int, *, prepare: bool | None) -> None:
        def insert(number: int) -> None:
            key = f"{cell}-{turn}-{number}"
            sql, params = one_row_statement(
                "default", kind="bench-noop", dedupe_key=key, trigger={"key": key}, now=timezone.now()
            )
            on.execute(sql, params, prepare=prepare).fetchone()

        timed(cell, insert)

    with (
        psycopg.connect(options.database_url, autocommit=True) as runner,
        psycopg.connect(options.database_url, autocommit=True, cursor_factory=psycopg.ClientCursor) as bound,
        override_settings(DATABASE_ROUTERS=[router]),
    ):
        postgresql.listen(runner, CHANNEL)
        for turn in range(options.enqueue_rounds + 1):  # the first round warms up (dropped below)
            timed("raw INSERT", lambda number: connection.execute(RAW_INSERT, [number]))
            insert_alone(bound, "its INSERT alone", turn, prepare=None)
            insert_alone(connection, "its INSERT alone, prepared", turn, prepare=True)
            enqueue_on(None, "default", turn)
            enqueue_on("prepared", "prepared", turn)
            postgresql.hold_waiting_lock(runner)
            enqueue_on(None, "default, a runner waits", turn)
            enqueue_on("prepared", "prepared, a runner waits", turn)
            postgresql.release_waiting_lock(runner)
            notified = sum(1 for _ in runner.notifies(timeout=2, stop_after=200))
            if notified < 200:
                raise SystemExit(f"{notified} NOTIFYs for 200 enqueues while a runner waited")
    if connections["prepared"].connection is None:
        raise SystemExit("the prepared cells never reached the prepared alias: is the router installed?")
    connections.close_all()
    execute(f"TRUNCATE {TABLE}")
    medians = {cell: statistics.median(values[1:]) for cell, values in micros.items()}
    return {
        "enqueue_rounds": options.enqueue_rounds,
        "enqueue_micros": medians,
        "enqueue_shares": {cell: medians["raw INSERT"] / median for cell, median in medians.items()},
    }


FLOOR_TABLE = "bench_floor"


def idle_floor(options: argparse.Namespace, connection: Any) -> dict[str, Any]:
    """The floor of an idle enqueue-to-start: the simplest worker there can be, measured with
    the compare section's latency protocol. An INSERT whose row trigger sends ``NOTIFY`` with
    the row's id (the enqueue, one durable commit); a psycopg process that LISTENs and, on
    each ``NOTIFY``, claims that row with one ``UPDATE … RETURNING`` (the claim, the second
    durable commit), then takes ``time.time()`` as the job's start. No framework, no thread,
    no journal: what any design pays that never starts a job before its claim is durable."""
    import random

    connection.execute(f"DROP TABLE IF EXISTS {FLOOR_TABLE}")
    connection.execute(
        f"CREATE TABLE {FLOOR_TABLE} (id bigserial PRIMARY KEY, claimed boolean NOT NULL DEFAULT false, "
        "started double precision)"
    )
    connection.execute(
        "CREATE OR REPLACE FUNCTION bench_floor_notify() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_notify('bench_floor', NEW.id::text); RETURN NULL; END $$"
    )
    connection.execute(
        f"CREATE TRIGGER bench_floor_notify AFTER INSERT ON {FLOOR_TABLE} "
        "FOR EACH ROW EXECUTE FUNCTION bench_floor_notify()"
    )
    worker = WorkerProcess(
        [sys.executable, __file__, "floor-worker", "--database-url", options.database_url],
        env=dict(os.environ),
        cwd=ROOT,
    )
    pause = random.Random(7)
    latencies, enqueue_calls = [], []
    try:
        listening = lambda: "listening" in worker.output()  # noqa: E731
        wait_for(listening, timeout=30, every=0.05, what="the floor worker", worker=worker)
        for number in range(-1, options.latency_samples):  # the first one warms up, uncounted
            time.sleep(pause.uniform(0.2, 1.2))
            before = time.time()
            (row,) = connection.execute(f"INSERT INTO {FLOOR_TABLE} DEFAULT VALUES RETURNING id").fetchone()
            returned = time.time()
            time.sleep(0.05)
            started = wait_for(
                lambda row=row: connection.execute(
                    f"SELECT started FROM {FLOOR_TABLE} WHERE id = %s", [row]
                ).fetchone()[0],
                timeout=30,
                every=0.01,
                what="a floor probe",
                worker=worker,
            )
            if number >= 0:
                latencies.append((started - before) * 1000)
                enqueue_calls.append((returned - before) * 1000)
    finally:
        worker.stop()
        connection.execute(f"DROP TABLE {FLOOR_TABLE}")
        connection.execute("DROP FUNCTION bench_floor_notify()")
    return {
        "floor_latency_ms": statistics.median(latencies),
        "floor_enqueue_ms": statistics.median(enqueue_calls),
        "floor_pickup_ms": statistics.median(b - a for a, b in zip(enqueue_calls, latencies, strict=True)),
        "floor_latency_samples": latencies,
    }


def floor_worker(options: argparse.Namespace) -> dict[str, Any]:
    """The floor's worker (a process of its own, started by :func:`idle_floor`)."""
    import psycopg

    with psycopg.connect(options.database_url, autocommit=True) as connection:
        connection.execute("LISTEN bench_floor")
        print("listening", flush=True)
        while True:
            # The generator holds the connection: take what arrived, then query.
            for notification in list(connection.notifies(stop_after=1)):
                claimed = connection.execute(
                    f"UPDATE {FLOOR_TABLE} SET claimed = true WHERE id = %s AND NOT claimed RETURNING id",
                    [int(notification.payload)],
                ).fetchone()
                started = time.time()  # the job's first statement
                if claimed:
                    record = f"UPDATE {FLOOR_TABLE} SET started = %s WHERE id = %s"
                    connection.execute(record, [started, claimed[0]])


SECTIONS = {
    "scaling": scaling,
    "growth": growth,
    "purge": purge,
    "limit": limit,
    "floor-worker": floor_worker,  # started by the limit section
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("section", choices=sorted(SECTIONS))
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--items", type=int, default=1000, help="items per drain")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 100_000, 1_000_000])
    parser.add_argument("--expired", type=int, default=1_000_000)
    parser.add_argument("--backlog", type=int, default=300_000)
    parser.add_argument("--timeout", type=float, default=900.0, help="most seconds the purge may take")
    parser.add_argument("--timed-batches", type=int, default=50, help="purge batches timed alone first")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per physical-limit figure")
    parser.add_argument("--enqueue-rounds", type=int, default=20, help="limit: rounds of the enqueue shares")
    parser.add_argument("--latency-samples", type=int, default=30, help="limit: samples of the idle floor")
    options = parser.parse_args()
    if options.section not in ("limit", "floor-worker"):
        setup(options.database_url)
        assert_alone(scalar)
    started = time.perf_counter()
    result = SECTIONS[options.section](options)
    result["section_seconds"] = time.perf_counter() - started
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""What the admin's deferred-work list costs at production scale (PostgreSQL, MariaDB).

    .venv/bin/python benchmarks/admin_list.py --database-url postgres://postgres@127.0.0.1:5432/nw_admin_bench
    .venv/bin/python benchmarks/admin_list.py --database-url mysql://root@127.0.0.1:3306/nw_admin_bench

Fills its own database (emptied first) with ``--rows`` rows by one ``INSERT … SELECT``
(94% done, 2% abandoned, 2% pending of which half due, 1% processing of which half with a
stale heartbeat, 1% of a kind no longer registered; ten kinds), analyses the table, then
requests list pages through Django's test client as a superuser and prints, per page,
the median time of the whole request and of its SQL, and its slowest statements.
``--backlog N`` first makes N done rows pending and due (runners down); the median time of
the unknown-kinds read (the notice above every list page) is printed too. Asserts
nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TABLE = "nexus_workflows_deferredwork"
COLUMNS = (
    "kind, dedupe_key, trigger, checkpoints, status, attempt, next_attempt_at, claim_token, "
    "last_error, history, created_at, updated_at, heartbeat_at, backend_name, queue_name, "
    "errors, worker_ids, priority, lost_unstarted"
)
PAGES = {
    "all": "",
    "all page 100": "?p=99",
    "needs attention": "?status=attention",
    "pending": "?status=pending",
    "one kind": "?kind=bench-kind-3",
    "done of one kind": "?status=done&kind=bench-kind-3",
    # The end of an estimated list: its last estimated page, and past it (a stale link).
    "last page": "?p=6000",
    "past the end": "?p=7000",
    "done of one kind, past the end": "?status=done&kind=bench-kind-3&p=700",
}


def setup(database_url: str) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def execute(sql: str) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql)


def status_case(n: str) -> str:
    """status by ``n`` (1..100): 94 done, 2 abandoned, 2 pending, 1 processing, 1 pending of
    an unregistered kind."""
    return (
        f"CASE WHEN {n} % 100 < 94 THEN 'done' WHEN {n} % 100 < 96 THEN 'abandoned' "
        f"WHEN {n} % 100 < 99 THEN 'pending' ELSE 'processing' END"
    )


def fill(rows: int) -> float:
    from django.db import connection

    execute(f"DELETE FROM {TABLE}")
    started = time.perf_counter()
    if connection.vendor == "postgresql":
        source, n, now = f"generate_series(1, {rows}) AS g", "g", "now()"
        ago = "now() - make_interval(secs => g % 86400)"
        kind = "CASE WHEN g % 100 = 98 THEN 'removed-kind' ELSE 'bench-kind-' || (g % 10) END"
        key, json_key, empty = "'key-' || g", "jsonb_build_object('key', 'key-' || g)", "'{}'::jsonb"
        arr = "'[]'::jsonb"
        due = f"CASE WHEN g % 2 = 0 THEN {now} + interval '1 hour' ELSE {ago} END"
        heartbeat = "CASE WHEN g % 2 = 0 THEN now() ELSE now() - interval '1 hour' END"
    else:  # MariaDB: its sequence engine
        source, n, now = f"seq_1_to_{rows} AS s", "s.seq", "UTC_TIMESTAMP(6)"
        ago = "UTC_TIMESTAMP(6) - INTERVAL (s.seq % 86400) SECOND"
        kind = "IF(s.seq % 100 = 98, 'removed-kind', CONCAT('bench-kind-', s.seq % 10))"
        key, json_key, empty = "CONCAT('key-', s.seq)", "JSON_OBJECT('key', CONCAT('key-', s.seq))", "'{}'"
        arr = "'[]'"
        due = f"IF(s.seq % 2 = 0, {now} + INTERVAL 1 HOUR, {ago})"
        heartbeat = "IF(s.seq % 2 = 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL 1 HOUR)"
    status = status_case(n)
    columns = ", ".join(connection.ops.quote_name(name.strip()) for name in COLUMNS.split(","))
    execute(
        f"INSERT INTO {TABLE} ({columns}) SELECT {kind}, {key}, {json_key}, {empty}, {status}, 0, "
        f"{due}, '', '', {arr}, {ago}, {ago}, {heartbeat}, '', '', {arr}, {arr}, 0, 0 FROM {source}"
    )
    # Only processing rows keep a heartbeat (half of them stale).
    execute(f"UPDATE {TABLE} SET heartbeat_at = NULL WHERE status <> 'processing'")
    seconds = time.perf_counter() - started
    execute(f"ANALYZE {TABLE}" if connection.vendor == "postgresql" else f"ANALYZE TABLE {TABLE}")
    return seconds


def make_backlog(rows: int) -> None:
    """``rows`` done rows made pending and due a minute ago, then analysed: an outage's backlog."""
    from django.db import connection

    now = "now()" if connection.vendor == "postgresql" else "UTC_TIMESTAMP(6)"
    execute(
        f"UPDATE {TABLE} SET status = 'pending', next_attempt_at = {now} - INTERVAL '1' MINUTE "
        f"WHERE status = 'done' AND id <= (SELECT m FROM (SELECT MIN(id) + {rows} * 100 / 94 AS m "
        f"FROM {TABLE}) AS bounds)"
    )
    # The kind no longer registered is due too (the notice has something to show).
    execute(f"UPDATE {TABLE} SET next_attempt_at = {now} WHERE kind = 'removed-kind'")
    execute(f"ANALYZE {TABLE}" if connection.vendor == "postgresql" else f"ANALYZE TABLE {TABLE}")


def time_unknown_kinds(runs: int) -> float:
    """Median ms of the admin's due-of-unknown-kinds read (the notice above every list page)."""
    from nexus_workflows.clock import DatabaseNow
    from nexus_workflows.deferred.unknown_kinds import due_of_unknown_kinds

    due_of_unknown_kinds(DatabaseNow())  # warm
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        due_of_unknown_kinds(DatabaseNow())
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 1)


def measure(client: Any, query: str, runs: int) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client.get("/admin/nexus_workflows/deferredwork/" + query)  # warm
    totals, sql_totals = [], []
    slowest: list[tuple[float, str]] = []
    for _ in range(runs):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get("/admin/nexus_workflows/deferredwork/" + query)
            totals.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
        timed = [(float(q["time"]) * 1000, q["sql"]) for q in queries.captured_queries]
        sql_totals.append(sum(t for t, _ in timed))
        slowest = sorted(timed, reverse=True)[:3]
    return {
        "page_ms": round(statistics.median(totals), 1),
        "sql_ms": round(statistics.median(sql_totals), 1),
        "slowest": [(round(t, 1), sql[:140]) for t, sql in slowest],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--no-fill", action="store_true", help="measure the rows already there")
    parser.add_argument(
        "--backlog", type=int, default=0, help="make this many done rows pending and due (runners down)"
    )
    options = parser.parse_args()
    if options.database_url.startswith("postgres"):
        from benchmarks.deferred_throughput import ensure_postgres_database

        ensure_postgres_database(options.database_url)
    setup(options.database_url)
    from django.contrib.auth.models import User
    from django.test import Client
    from django.test.utils import setup_test_environment

    from nexus_workflows import register

    setup_test_environment()  # the test client's host
    for k in range(10):  # "removed-kind" stays unregistered
        register(
            f"bench-kind-{k}", dedupe_key=lambda t: t["key"], prepare=lambda t, c, s: None, retry_schedule=[1]
        )
    report: dict[str, Any] = {"rows": options.rows, "load": os.getloadavg()}
    if not options.no_fill:
        report["fill_seconds"] = round(fill(options.rows), 1)
    if options.backlog:
        make_backlog(options.backlog)
    report["unknown_kinds_ms"] = time_unknown_kinds(options.runs)
    user, _ = User.objects.get_or_create(username="bench", defaults={"is_staff": True, "is_superuser": True})
    client = Client()
    client.force_login(user)
    from django.conf import settings

    settings.DEBUG = True  # connection.queries timings
    report["pages"] = {name: measure(client, query, options.runs) for name, query in PAGES.items()}
    report["load_after"] = os.getloadavg()
    for name, figures in report["pages"].items():
        print(f"{name:20} page {figures['page_ms']:8.1f} ms   sql {figures['sql_ms']:8.1f} ms")
        for seconds, sql in figures["slowest"]:
            print(f"    {seconds:7.1f} ms  {sql}")
    print(json.dumps({k: v for k, v in report.items() if k != "pages"}))


if __name__ == "__main__":
    main()

"""Fault suite: an operator's ``idle_session_timeout`` (PostgreSQL 14+) on the runner's
database. Every session the runner keeps ends when it sits idle that long: the wake-up
listener's ``LISTEN`` session (idle by nature), the main loop's between polls, a
worker's, journal writer's or the heartbeat's between uses. None of that is an outage:
wake-ups keep arriving, no attempt is released or retried, and nothing is logged."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.drains import TABLE, query, run_to_end
from tests.faults.servers import PrivatePostgres
from tests.processes import ManagePy, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

DATABASE = "nw_faults_idle"
IDLE_TIMEOUT = 1.0  # seconds
# Polls and heartbeats further apart than the timeout: only a wake-up starts work soon,
# and every beat finds its session ended (unless the runner keeps or renews it). One
# worker thread and one journal writer (DB_CONNECTIONS less three), so every item meets
# the session its predecessor left idle.
SETTINGS = {
    "POLL_INTERVAL": 5,
    "HEARTBEAT_INTERVAL": 2,
    "STALE_AFTER": 30,
    "SHUTDOWN_GRACE": 5,
    "CONCURRENCY": 1,
    "DB_CONNECTIONS": 4,
}
ITEMS = 3

# One item held across heartbeats (an async one: the worker thread stays free), then
# items one by one, each after the runner's sessions sat idle past the timeout. The
# enqueuer's own session ends too between them.
ENQUEUE = """
import threading
from django.db import connection
from nexus_workflows import enqueue
enqueue("test-interval-async", {{"key": "slow", "ledger": {ledger!r}, "seconds": 2.5}})
for number in range({items}):
    threading.Event().wait({gap})
    connection.close()
    enqueue("test-two-steps", {{"key": str(number)}})
"""


def test_sessions_the_server_ends_when_idle_are_renewed_quietly(
    private_postgres: PrivatePostgres, tmp_path: Path, report_figures: Callable[[str], None]
) -> None:
    private_postgres.create_database(DATABASE)
    url = private_postgres.url(DATABASE)
    run_to_end("migrate", "--no-input", "-v", "0", url=url)
    import psycopg

    with psycopg.connect(private_postgres.url(), autocommit=True) as connection:
        connection.execute(f"ALTER DATABASE {DATABASE} SET idle_session_timeout = '{IDLE_TIMEOUT:g}s'")
    runner = ManagePy("runworkflows", settings=SETTINGS, database_url=url)
    try:
        runner.wait_for_output("runner started", timeout=60)
        enqueue = ENQUEUE.format(items=ITEMS, gap=IDLE_TIMEOUT * 1.6, ledger=str(tmp_path / "ledger"))
        run_to_end("shell", "-c", enqueue, url=url)
        done = f"SELECT count(*) FROM {TABLE} WHERE status = 'done'"
        wait_for(lambda: (query(url, done) or [(0,)])[0][0] == ITEMS + 1, timeout=30, what="all work done")
        assert runner.process.poll() is None  # alive
        assert runner.terminate() == 0, runner.output()
        output = runner.output()
    finally:
        runner.close()
    latencies = [
        seconds
        for (seconds,) in query(
            url,
            f"SELECT extract(epoch FROM min(l.created_at) - w.created_at)::float FROM {TABLE} w "
            "JOIN testapp_ledger l ON l.key = w.dedupe_key WHERE w.kind = 'test-two-steps' GROUP BY w.id",
        )
        or []
    ]
    attempts = query(url, f"SELECT attempt, count(*) FROM {TABLE} GROUP BY attempt")
    rounded = [round(seconds, 3) for seconds in latencies]
    report_figures(f"idle_session_timeout {IDLE_TIMEOUT:g}s: enqueue-to-start latencies {rounded}")
    assert attempts == [(0, ITEMS + 1)]
    assert len(latencies) == ITEMS
    assert max(latencies) < 2.5, latencies  # woken by NOTIFY (polls are 5 s apart)
    for noise in ("lost its connection", "heartbeat failed", "database unavailable", "released", "ERROR"):
        assert noise not in output, output
    assert f"runner stopped: {ITEMS + 1} done, 0 rescheduled, 0 abandoned, 0 reclaimed\n" in output, output

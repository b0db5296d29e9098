"""Fault suite: a done whose commit succeeded but whose answer was lost, because the
private PostgreSQL cluster crashed (``pg_ctl restart -m immediate``) between the two. The
runner writes the done again after the outage; it matches nothing, and the runner must
still count the work done, not "claim lost; result discarded"."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults.drains import TABLE, query, run_to_end
from tests.faults.servers import PrivatePostgres
from tests.processes import ManagePy, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

# No heartbeat while commits are held: one waiting for its answer would hold the row's
# lock, and the done would wait for that lock instead of its own answer.
SETTINGS = {"POLL_INTERVAL": 0.2, "HEARTBEAT_INTERVAL": 30, "STALE_AFTER": 120, "SHUTDOWN_GRACE": 5}

ENQUEUE = """
from nexus_workflows import enqueue
enqueue("test-interval", {{"key": "1", "ledger": {ledger!r}, "seconds": 600, "until_file": {until!r}}})
"""


def execute(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:  # ALTER SYSTEM: no transaction
        connection.execute(sql)


def waiting_for_a_standby(url: str, text: str) -> list[tuple[Any, ...]]:
    """Sessions whose commit waits for a synchronous standby, running a statement with ``text``."""
    sql = (
        f"SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query LIKE '%{text}%' "
        "AND pid <> pg_backend_pid()"
    )
    return query(url, sql) or []


def hold_commits_unanswered(server: PrivatePostgres) -> None:
    """From now on every commit that wrote something is written but not answered: it waits
    for a synchronous standby that does not exist. Returns once a probe's commit (on the
    ``postgres`` database) waits so: the setting reaches the server's processes a moment
    after the reload."""
    import psycopg

    execute(server.url(), "CREATE TABLE IF NOT EXISTS nw_probe (n int)")
    execute(server.url(), "ALTER SYSTEM SET synchronous_standby_names = 'nw_no_such_standby'")
    execute(server.url(), "SELECT pg_reload_conf()")
    held = threading.Event()

    def probe() -> None:
        with psycopg.connect(server.url(), autocommit=True) as connection:
            while not held.is_set():
                connection.execute("INSERT INTO nw_probe VALUES (1)")

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        waiting = wait_for(lambda: waiting_for_a_standby(server.url(), "nw_probe"), timeout=30, what="held")
        ((pid,), *_) = waiting
        held.set()
        # Its commit stays written; the cancel only ends its wait (with a warning).
        execute(server.url(), f"SELECT pg_cancel_backend({int(pid)})")
    finally:
        held.set()
        thread.join(30)


def test_a_done_whose_answer_was_lost_in_a_crash_counts_as_done(
    private_postgres: PrivatePostgres, tmp_path: Path, report_figures: Callable[[str], None]
) -> None:
    private_postgres.create_database("nw_faults_answer")
    url = private_postgres.url("nw_faults_answer")
    until = tmp_path / "until"
    run_to_end("migrate", "--no-input", "-v", "0", url=url)
    run_to_end("shell", "-c", ENQUEUE.format(ledger=str(tmp_path / "ledger"), until=str(until)), url=url)
    runner = ManagePy("runworkflows", "--kind", "test-interval", settings=SETTINGS, database_url=url)
    try:
        runner.wait_for_output("runner started", timeout=60)
        # Started (marked): the attempt's next write is its done.
        started = f"SELECT 1 FROM {TABLE} WHERE status = 'processing' AND started_at IS NOT NULL"
        wait_for(lambda: query(url, started), timeout=30, what="the attempt started")
        hold_commits_unanswered(private_postgres)
        until.touch()  # the prepare returns
        wait_for(lambda: waiting_for_a_standby(url, "finished_at"), timeout=30, what="the done committed")
        # The crash: the done is in the WAL, its answer never left. Back without a standby.
        execute(url, "ALTER SYSTEM RESET synchronous_standby_names")
        away = private_postgres.restart("immediate")
        assert query(url, f"SELECT status FROM {TABLE}") == [("done",)]  # the first commit did succeed
        said = ("attempt 1 of 4: done", "claim lost")
        wait_for(lambda: any(line in runner.output() for line in said), timeout=60, what="the done again")
        assert runner.terminate() == 0, runner.output()
        output = runner.output()
    finally:
        runner.close()
    report_figures(f"done's answer lost in a crash: server away {away:.2f}s; the runner said done again")
    assert "database unavailable" in output  # the runner did see the outage
    assert "claim lost" not in output, output
    assert "runner stopped: 1 done, 0 rescheduled, 0 abandoned, 0 reclaimed\n" in output, output

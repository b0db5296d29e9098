"""Fault suite: the database turns read-only under a running attempt, as an operator's
``default_transaction_read_only`` (or a DSN that now points at a hot standby) makes it.
Every write is refused with ReadOnlySqlTransaction, an InternalError, not the
OperationalError of a database that went away. It is still an outage: the attempt whose
``save()`` was refused is released, not counted; the runner neither crashes nor logs the
item's write as failing; and it resumes on a new session once the database takes writes
again (a session keeps the read-only default it began with, however long it lives)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.drains import TABLE, query, run_to_end
from tests.faults.servers import PrivatePostgres
from tests.processes import ManagePy, overlapping, read_intervals, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

DATABASE = "nw_faults_read_only"
SETTINGS = {"POLL_INTERVAL": 0.2, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 60, "SHUTDOWN_GRACE": 5}
READ_ONLY_LINE = "database unavailable (InternalError: the database is read-only)"

ENQUEUE = """
from nexus_workflows import enqueue
enqueue({kind!r}, {{"key": "1", "ledger": {ledger!r}, "seconds": 600, "until_file": {until!r}, "steps": 1}})
"""


def execute(server: PrivatePostgres, *statements: str) -> None:
    """Run ``statements`` on the server's ``postgres`` database, on a session that takes writes."""
    import psycopg

    with psycopg.connect(server.url(), autocommit=True) as connection:  # ALTER SYSTEM: no transaction
        connection.execute("SET default_transaction_read_only = off")  # whatever the server's says
        for statement in statements:
            connection.execute(statement)


def read_only(server: PrivatePostgres, on: bool) -> None:
    """Every session of the database refuses writes (``on``): sessions that exist by the
    reload of the server's setting, sessions opened later by the database's own. Off: the
    server's setting first (the sessions that existed before are writable again), then the
    database's, which sessions opened meanwhile keep until they reconnect."""
    if on:
        execute(
            server,
            f"ALTER DATABASE {DATABASE} SET default_transaction_read_only = on",
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
        )
    else:
        execute(
            server,
            "ALTER SYSTEM RESET default_transaction_read_only",
            "SELECT pg_reload_conf()",
            f"ALTER DATABASE {DATABASE} RESET default_transaction_read_only",
        )


# A sync prepare (its save on a journal writer, from a worker thread) and an async one.
@pytest.mark.parametrize("kind", ["test-interval", "test-interval-async"])
def test_a_read_only_database_is_an_outage_that_costs_no_attempt(
    private_postgres: PrivatePostgres, tmp_path: Path, report_figures: Callable[[str], None], kind: str
) -> None:
    private_postgres.create_database(DATABASE)
    url = private_postgres.url(DATABASE)
    ledger, until = tmp_path / "ledger", tmp_path / "until"
    run_to_end("migrate", "--no-input", "-v", "0", url=url)
    run_to_end("shell", "-c", ENQUEUE.format(kind=kind, ledger=str(ledger), until=str(until)), url=url)
    runner = ManagePy("runworkflows", "--kind", kind, settings=SETTINGS, database_url=url)
    try:
        runner.wait_for_output("runner started", timeout=60)
        started = f"SELECT 1 FROM {TABLE} WHERE status = 'processing' AND started_at IS NOT NULL"
        wait_for(lambda: query(url, started), timeout=30, what="the attempt to start")
        read_only(private_postgres, True)
        until.touch()  # the prepare goes on to its save(), which the database refuses
        wait_for(
            lambda: READ_ONLY_LINE in runner.output() or "writing its outcome failed" in runner.output(),
            timeout=30,
            what="the runner to meet the read-only database",
        )
        read_only(private_postgres, False)
        done = f"SELECT 1 FROM {TABLE} WHERE status = 'done'"
        wait_for(lambda: query(url, done), timeout=30, what="the work to be done once writable")
        assert runner.process.poll() is None  # alive
        assert runner.terminate() == 0, runner.output()
        output = runner.output()
    finally:
        runner.close()
    ((attempt, history),) = query(url, f"SELECT attempt, history FROM {TABLE}") or []
    history = json.loads(history) if isinstance(history, str) else history
    intervals = read_intervals(ledger)
    report_figures(
        f"read-only database ({kind}): attempt {attempt}; history {[entry['outcome'] for entry in history]}; "
        f"executions {len(intervals)}"
    )
    assert attempt == 0, output  # the refusal consumed no attempt
    outcomes = [(entry["outcome"], entry.get("reason")) for entry in history]
    assert outcomes == [("released", "database unavailable")]
    assert output.count(READ_ONLY_LINE) == 1, output  # said once, by its cause
    assert "database reachable again" in output
    assert "writing its outcome failed" not in output  # not the item's fault
    assert "runner loop error" not in output, output
    assert "outcome counts not written" not in output, output  # held and written later, too
    assert [interval.ended for interval in intervals] == [False, True]  # refused once, then ran to the end
    assert overlapping(intervals) == []
    assert "runner stopped: 1 done, 0 rescheduled, 0 abandoned, 0 reclaimed, 1 released" in output, output

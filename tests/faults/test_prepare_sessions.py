"""Fault suite: a prepare that uses the ORM itself, and the server ends that session.

A sync prepare queries on its worker thread's connection, kept while the thread lives;
an ``async def`` prepare through ``sync_to_async`` or Django's async ORM methods, on the
one thread (and connection) all async attempts of a runner share. When the server ends
that session while it sits idle between attempts (an operator's ``idle_session_timeout``,
``pg_terminate_backend`` by a DBA or a failover tool, a pooler's idle timeout), the next
attempt gets a new one quietly, as Django renews a request's: no attempt fails, none is
released, nothing is logged. When it ends the session *during* an attempt, the prepare's
next query raises ``OperationalError``: an outage, so the attempt is released (attempt
unchanged, due in a second) and the next one runs on a new session."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.drains import TABLE, query, run_to_end
from tests.faults.servers import PrivatePostgres
from tests.processes import ManagePy

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

TEMPLATE = "nw_faults_sessions_template"
DATABASE = "nw_faults_sessions"
IDLE_TIMEOUT = 1.0  # seconds
# Work starts on wake-ups (polls are far apart); one worker thread, so every sync item
# meets the connection its predecessor left; the fewest connections of the runner's own.
SETTINGS = {
    "POLL_INTERVAL": 5,
    "HEARTBEAT_INTERVAL": 2,
    "STALE_AFTER": 30,
    "SHUTDOWN_GRACE": 5,
    "CONCURRENCY": 1,
    "DB_CONNECTIONS": 4,
}
ITEMS = 3
# Seconds from an item done to the next enqueued, at least: longer than the second a
# runner lets a connection sit idle before it checks it (pool.IDLE_CHECK_AFTER), and than
# the idle timeout. A session ended less than that after its last use is the next
# attempt's outage (test_a_session_ended_during_an_attempt_releases_it shows what follows).
GAP = 1.5
NOISE = ("failed", "released", "database unavailable", "lost its connection", "heartbeat failed", "ERROR")

ORM_KINDS = ["test-orm-sync", "test-orm-sync-to-async", "test-orm-async"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivatePostgres]:
    """One private cluster for the module, with a migrated template database: each test
    copies it (a second) instead of migrating its own (several)."""
    server = PrivatePostgres()
    try:
        server.start()
        server.create_database(TEMPLATE)
        run_to_end("migrate", "--no-input", "-v", "0", url=server.url(TEMPLATE))
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def database(cluster: PrivatePostgres) -> Iterator[str]:
    """A fresh copy of the migrated database; its URL."""
    cluster.create_database(DATABASE, template=TEMPLATE)
    try:
        yield cluster.url(DATABASE)
    finally:
        import psycopg

        with psycopg.connect(cluster.url(), autocommit=True) as connection:
            connection.execute(f"DROP DATABASE {DATABASE} WITH (FORCE)")


def drive(url: str, code: str, settings: dict[str, Any] = SETTINGS) -> tuple[str, str]:
    """Start a runner and, next to it, a shell running ``code`` (a driver of
    :mod:`tests.faults.sessions`); once the driver is done, stop the runner. Returns the
    driver's output and the runner's."""
    runner = ManagePy("runworkflows", settings=settings, database_url=url)
    driver = ManagePy("shell", "-c", f"from tests.faults import sessions\n{code}", database_url=url)
    try:
        assert driver.wait(90) == 0, f"{driver.output()}\nrunner:\n{runner.output()}"
        assert runner.process.poll() is None, runner.output()  # alive
        assert runner.terminate() == 0, runner.output()
        return driver.output(), runner.output()
    finally:
        driver.close()
        runner.close()


def rows(url: str, kind: str) -> list[tuple[str, str, int, list[dict[str, Any]]]]:
    """(key, status, attempt, history) of every item of ``kind``."""
    sql = f"SELECT dedupe_key, status, attempt, history FROM {TABLE} WHERE kind = '{kind}' ORDER BY id"
    found = query(url, sql)
    return [
        (key, status, attempt, json.loads(history) if isinstance(history, str) else history)
        for key, status, attempt, history in found or []
    ]


def ledger(url: str, kind: str) -> list[tuple[str, str]]:
    """(key, step) of every ledger row the prepares of ``kind`` wrote, in order."""
    found = query(url, f"SELECT key, step FROM testapp_ledger WHERE kind = '{kind}' ORDER BY id")
    return [(key, step) for key, step in found or []]


@pytest.mark.parametrize("fault", ["idle_session_timeout", "pg_terminate_backend"])
@pytest.mark.parametrize("kind", ORM_KINDS)
def test_a_prepares_session_ended_between_attempts_is_renewed_quietly(
    cluster: PrivatePostgres, database: str, kind: str, fault: str
) -> None:
    if fault == "idle_session_timeout":
        import psycopg

        with psycopg.connect(cluster.url(), autocommit=True) as connection:
            connection.execute(f"ALTER DATABASE {DATABASE} SET idle_session_timeout = '{IDLE_TIMEOUT:g}s'")
    driver = f"sessions.enqueue_one_by_one({kind!r}, {ITEMS}, fault={fault!r}, gap={GAP})"
    driven, output = drive(database, driver)

    assert driven.count("the prepare's") == ITEMS - 1, driven  # each item but the first met an ended session
    # Every attempt ran its prepare once, to the end, at attempt 0: none failed on the
    # session, none was released for it, nothing about it was logged.
    assert rows(database, kind) == [(str(n), "done", 0, []) for n in range(ITEMS)]
    assert ledger(database, kind) == [(str(n), "done") for n in range(ITEMS)]
    for noise in (*NOISE, "Traceback"):
        assert noise not in output, output
    assert f"runner stopped: {ITEMS} done, 0 rescheduled, 0 abandoned, 0 reclaimed\n" in output, output


@pytest.mark.parametrize("kind", ["test-orm-sync-session-ends", "test-orm-async-session-ends"])
def test_a_session_ended_during_an_attempt_releases_it(database: str, kind: str, tmp_path: Path) -> None:
    # The released attempt is due a second later; a poll finds it (a release wakes no one).
    settings = {**SETTINGS, "POLL_INTERVAL": 0.5}
    driver = f"sessions.end_session_mid_attempt({kind!r}, {str(tmp_path)!r})"
    driven, output = drive(database, driver, settings)

    assert "terminated the prepare's session" in driven, driven
    # The prepare's second query met the ended session: released for the outage, not
    # counted; the next attempt queried on a new session and ran to its end.
    ((key, status, attempt, history),) = rows(database, kind)
    assert (key, status, attempt) == ("0", "done", 0)
    assert [(entry["outcome"], entry["reason"], entry["attempt"]) for entry in history] == [
        ("released", "database unavailable", 0)
    ]
    assert ledger(database, kind) == [("0", "before"), ("0", "before"), ("0", "after")]
    assert output.count("released, attempt unchanged") == 1, output
    assert "(OperationalError" in output, output
    for noise in ("ERROR", "Traceback", "rescheduled in", "abandoned:"):
        assert noise not in output, output
    assert "runner stopped: 1 done, 0 rescheduled, 0 abandoned, 0 reclaimed, 1 released\n" in output, output

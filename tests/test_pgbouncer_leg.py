"""bin/test's PgBouncer leg starts on a fresh test database whatever a killed run left: its
``python -m tests.pgbouncer --fresh-test-database`` drops pytest-django's test database
straight on PostgreSQL before its PgBouncer starts, ending the server sessions an orphaned
PgBouncer of a killed run still holds."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.conftest import IN_CI
from tests.pgbouncer import PgBouncer
from tests.processes import wait_for
from tests.raw_connections import raw_connection

ROOT = Path(__file__).resolve().parent.parent


def _exists(admin: Any, name: str) -> bool:
    return admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is not None


def _ended(session: Any) -> bool:
    try:
        session.execute("SELECT 1")
    except Exception:  # noqa: BLE001 - whatever the driver says: the server ended it
        return True
    return False


def _leave_a_killed_runs_leftovers(database: str) -> Any:
    """A row and the lock-wait trigger of tests/raw_connections.py in ``database``, and an
    open session on it (what an orphaned PgBouncer keeps), returned."""
    left = raw_connection(dbname=database)
    left.execute("CREATE TABLE leftover (id int)")
    left.execute("INSERT INTO leftover VALUES (1)")
    left.execute(
        "CREATE FUNCTION nw_test_lock_wait() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$"
    )
    left.execute(
        "CREATE TRIGGER nw_test_lock_wait BEFORE UPDATE ON leftover FOR EACH ROW "
        "EXECUTE FUNCTION nw_test_lock_wait()"
    )
    return left


@pytest.mark.postgresql
def test_the_leg_drops_what_a_killed_run_left_in_its_test_database(tmp_path: Path) -> None:
    """The leg's PgBouncer program, started as bin/test starts it, drops the test database
    a killed run left (rows, a test trigger, a session on it) before it serves."""
    if not PgBouncer.available():
        message = "Debian's pgbouncer is not installed (bin/test installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    base = f"nx_leg_{uuid.uuid4().hex[:8]}"
    params = connection.get_connection_params()
    upstream = f"postgres://{params.get('user') or 'postgres'}@{params['host']}:{params['port']}/{base}"
    admin = raw_connection(dbname="postgres")
    admin.execute(f'CREATE DATABASE "test_{base}"')
    left = _leave_a_killed_runs_leftovers(f"test_{base}")
    url_file = tmp_path / "url"
    command = [sys.executable, "-m", "tests.pgbouncer", "--upstream", upstream, "--url-file", str(url_file)]
    leg = subprocess.Popen(
        [*command, "--fresh-test-database"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    try:
        wait_for(lambda: url_file.exists() or leg.poll() is not None, timeout=30, what="its PgBouncer")
        assert leg.poll() is None, f"the leg's PgBouncer program ended ({leg.returncode})"
        assert not _exists(admin, f"test_{base}")
        assert _ended(left)
    finally:
        leg.terminate()
        leg.wait(timeout=30)
        left.close()
        admin.execute(f'DROP DATABASE IF EXISTS "test_{base}" WITH (FORCE)')
        admin.close()

"""Migration 0019 adds the work table's ending trigger on PostgreSQL (nothing elsewhere).
Its CREATE TRIGGER (and its reverse's DROP TRIGGER) locks the table against every write:
waiting for that lock behind an open transaction that wrote the table would queue every
later enqueue, claim and heartbeat behind it, so the wait is bounded (``LOCK_WAIT``) and
the migration fails, nothing written, to be run again. Run again over an existing
trigger (a migration recorded as unapplied by hand), it replaces it."""

from __future__ import annotations

import time

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.utils import OperationalError

from tests.migrating import APP, TABLE, migrate, migrate_in_thread, recorded
from tests.raw_connections import raw_connection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

BEFORE = "0018_mariadb_due_per_kind_and_queue"
MIGRATION = "0019_notify_attempt_ended_while_full"
# The migration's bound (its LOCK_WAIT), and what the test waits beyond it before
# calling the migration stuck.
LOCK_WAIT = 5.0
MARGIN = 10.0


def _trigger_exists() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT FROM pg_trigger WHERE tgname = 'nexus_workflows_attempt_ended' "
            "AND tgrelid = %s::regclass)",
            [TABLE],
        )
        return bool(cursor.fetchone()[0])


def _run_behind_a_writer(target: str) -> tuple[bool, float, list[Exception]]:
    """``migrate(target)`` in a thread while another session holds an open transaction
    that wrote the work table: (whether it was still waiting after LOCK_WAIT + MARGIN,
    the seconds it ran until it ended or that, what it raised)."""
    holder = raw_connection()
    failures: list[Exception] = []
    try:
        holder.execute("BEGIN")
        holder.execute(f"LOCK TABLE {TABLE} IN ROW EXCLUSIVE MODE")  # what an insert takes
        began = time.monotonic()
        thread = migrate_in_thread(target, failures)
        thread.join(timeout=LOCK_WAIT + MARGIN)
        ran = time.monotonic() - began
        stuck = thread.is_alive()
        holder.execute("ROLLBACK")
        thread.join(timeout=60)
    finally:
        holder.close()
    return stuck, ran, failures


def test_forwards_behind_an_open_write_gives_up_after_the_bound_and_writes_nothing() -> None:
    migrate(BEFORE)
    try:
        stuck, ran, failures = _run_behind_a_writer(MIGRATION)
        assert not stuck, "the migration waited for the table lock beyond its bound"
        assert ran >= LOCK_WAIT - 0.5
        assert [type(error) for error in failures] == [OperationalError]
        assert "lock timeout" in str(failures[0])
        assert (APP, MIGRATION) not in recorded()
        assert not _trigger_exists()
    finally:
        migrate(None)
    assert _trigger_exists()


def test_backwards_behind_an_open_write_gives_up_after_the_bound_and_keeps_the_trigger() -> None:
    try:
        stuck, _ran, failures = _run_behind_a_writer(BEFORE)
        assert not stuck, "the migration waited for the table lock beyond its bound"
        assert [type(error) for error in failures] == [OperationalError]
        assert (APP, MIGRATION) in recorded()
        assert _trigger_exists()
    finally:
        migrate(None)


def test_run_again_over_an_existing_trigger_replaces_it() -> None:
    executor = MigrationExecutor(connection)
    try:
        executor.migrate([(APP, BEFORE)], fake=True)  # recorded as unapplied, trigger kept
        assert _trigger_exists()
        migrate(MIGRATION)
        assert (APP, MIGRATION) in recorded()
    finally:
        migrate(None)
    assert _trigger_exists()

"""A statement the database answered without running it is no outage: a lock waited for
longer than ``lock_timeout`` (PostgreSQL 55P03) or ``innodb_lock_wait_timeout`` (MariaDB
1205), or a statement cancelled by ``statement_timeout`` (57014) or
``max_statement_time`` (1969). The session is fine and the same statement may pass at the
next turn, so the runner says it once and carries on, instead of logging "database
unavailable", backing off and reconnecting."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from nexus_workflows import enqueue
from nexus_workflows.database_errors import is_database_unavailable, statement_refused
from nexus_workflows.models import DeferredWork, Status
from tests.processes import ManagePy, wait_for
from tests.raw_connections import raw_connection, row_locked

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 2, "SHUTDOWN_GRACE": 1}


def error_of(*statements: str) -> DatabaseError:
    """The error the last of ``statements`` raises, in one transaction of this session."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
    except DatabaseError as error:
        return error
    raise AssertionError(f"{statements[-1]!r} succeeded")


def work_table() -> str:
    return connection.ops.quote_name(DeferredWork._meta.db_table)


def assert_refused_not_unavailable(error: DatabaseError, says: str) -> None:
    refused = statement_refused(error)
    assert refused is not None
    assert says in refused, refused
    assert not is_database_unavailable(error)


@pytest.mark.postgresql
def test_a_lock_wait_cut_short_and_a_cancel_are_refusals_on_postgresql() -> None:
    work_id = enqueue("test-ledger", {"key": "a"})
    with row_locked(DeferredWork, work_id):
        update = f"UPDATE {work_table()} SET attempt = 0 WHERE id = {int(work_id or 0)}"
        waited = error_of("SET LOCAL lock_timeout = '50ms'", update)
    cancelled = error_of("SET LOCAL statement_timeout = '1ms'", "SELECT pg_sleep(0.2)")
    assert_refused_not_unavailable(waited, "lock_timeout")
    assert_refused_not_unavailable(cancelled, "statement_timeout")


@pytest.mark.mysql
def test_a_lock_wait_cut_short_and_a_cancel_are_refusals_on_mariadb() -> None:
    work_id = enqueue("test-ledger", {"key": "a"})
    with row_locked(DeferredWork, work_id):
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
        try:
            waited = error_of(f"UPDATE {work_table()} SET attempt = 0 WHERE id = {int(work_id or 0)}")
        finally:
            connection.close()  # the session's setting goes with it
    # A billion-row join (MariaDB's sequence engine) cancelled after 10 ms.
    slow = "SELECT COUNT(*) FROM seq_1_to_10000 a, seq_1_to_100000 b"
    cancelled = error_of(f"SET STATEMENT max_statement_time = 0.01 FOR {slow}")
    assert_refused_not_unavailable(waited, "innodb_lock_wait_timeout")
    assert_refused_not_unavailable(cancelled, "max_statement_time")


@pytest.fixture
def database_lock_timeout() -> Iterator[None]:
    """The test database's own ``lock_timeout`` (every new session of it), 200 ms."""
    name = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {name} SET lock_timeout = '200ms'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER DATABASE {name} RESET lock_timeout")


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.usefixtures("database_lock_timeout")
def test_a_claim_cut_short_by_the_databases_lock_timeout_is_no_outage() -> None:
    """Another session holds the work table in SHARE mode (a plain ``CREATE INDEX`` on it
    does, for its whole build): the claim's ``UPDATE`` waits for the table, not a row, so
    ``SKIP LOCKED`` does not help, and the database's ``lock_timeout`` cuts it short. The
    runner said "database unavailable (OperationalError: LockNotAvailable)" and backed
    off as in an outage; it now says the claim did not pass, once, and runs the work once
    the table is free."""
    # -v 2: the later refusals' DEBUG lines show the runner claiming again, quietly.
    process = ManagePy("runworkflows", "--kind", "test-ledger", "-v", "2", settings=FAST)
    holder = raw_connection()
    try:
        process.wait_for_output("runner started")
        work_id = enqueue("test-ledger", {"key": "a"}, delay=0.5)
        holder.execute("SET lock_timeout = 0")
        holder.execute("BEGIN")
        holder.execute(f"LOCK TABLE {work_table()} IN SHARE MODE")
        wait_for(lambda: "did not pass" in process.output(), timeout=15, what="a claim to be cut short")
        # The next turns claim again (each waits 200 ms, then is cut short), said at DEBUG.
        wait_for(lambda: claims_waiting(holder), timeout=15, what="a later claim to wait for the table")
        wait_for(lambda: "did not pass again" in process.output(), timeout=15, what="a later refusal")
        holder.execute("ROLLBACK")
        wait_for(
            lambda: DeferredWork.objects.get(pk=work_id).status == Status.DONE,
            timeout=15,
            what="the work to run once the table is free",
        )
        assert process.terminate() == 0
        output = process.output()
    finally:
        holder.close()
        process.close()
    assert "database unavailable" not in output
    # Said at WARNING once per spell of refusals: the claims' spell, and at most one before
    # it when a turn at start-up met the lock before the row was due (turns then passed).
    warned = output.count("did not pass (it waited longer than lock_timeout for a lock); not an outage")
    assert 1 <= warned <= 2, output
    assert "did not pass again" in output


def claims_waiting(watcher: object) -> bool:
    """Whether a claim (an UPDATE) of the test database waits for a lock. The watcher is
    in a transaction: PostgreSQL keeps the first read of pg_stat_activity for the rest of
    it unless the snapshot is cleared (without, a first read before any claim waited was
    read again for ever)."""
    watcher.execute("SELECT pg_stat_clear_snapshot()")  # type: ignore[attr-defined]
    row = watcher.execute(  # type: ignore[attr-defined]
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'"
    ).fetchone()
    return bool(row[0])


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.usefixtures("database_lock_timeout")
def test_a_success_whose_write_waits_out_lock_timeouts_is_written_done_in_the_end(tmp_path: Any) -> None:
    """Another session holds the finished row's lock for several seconds, and the
    database's ``lock_timeout`` cuts each outcome write short. Those refusals pass once
    the lock goes: the success is written done, not replaced by ``OutcomeNotStored`` (a
    refusal of the value), which four of them did when both changes first met."""
    until = tmp_path / "until"
    work_id = enqueue("test-ends-when-told", {"key": "a", "until_file": str(until), "end": "done"})
    settings = {**FAST, "STALE_AFTER": 60}
    process = ManagePy("runworkflows", "--once", "--kind", "test-ends-when-told", settings=settings)
    holder = raw_connection()
    try:
        wait_for(
            lambda: DeferredWork.objects.get(pk=work_id).checkpoints.get("began"),
            timeout=30,
            what="the attempt to begin",
        )
        holder.execute("SET lock_timeout = 0")
        holder.execute("BEGIN")
        holder.execute(f"SELECT id FROM {work_table()} WHERE id = %s FOR UPDATE", [work_id])
        until.touch()
        refused = "writing its outcome failed (OperationalError); it stays held"
        wait_for(lambda: process.output().count(refused) >= 5, timeout=60, what="five refused writes")
        holder.execute("ROLLBACK")
        code = process.wait(timeout=60)
        output = process.output()
    finally:
        holder.close()
        process.close()
    assert code == 0, output
    work = DeferredWork.objects.get(pk=work_id)
    assert (work.status, work.last_error) == (Status.DONE, "")
    assert "OutcomeNotStored" not in output

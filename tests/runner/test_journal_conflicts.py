"""A journal batch and the other sessions that hold its rows.

A row another session holds a lock on (an operator's open transaction, a backfill, the
runner's own heartbeat) is skipped, not waited for: the batch's other saves are written at
once, and the held row's save is written once the lock goes, or fails with the database's
own lock error once it has waited as long as the session's ``lock_timeout`` says. (Before,
the batch waited for the lock, holding up to 200 attempts; and it could deadlock with the
heartbeat, which updated the same rows in the order of its own plan: in CI a batch of 200
first saves ended so, and every attempt failed.)

And a batch the database refused for one row's value (a project's trigger) fails only
that row's save: the others are written alone."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError

from nexus_workflows import enqueue
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.runner.journal import JournalWriter
from nexus_workflows.deferred.runner.journal_saves import Save
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.models import DeferredWork
from tests.processes import wait_for
from tests.raw_connections import lock_waits, raw_connection, row_changed, row_locked

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = DeferredWork._meta.db_table


def claimed_pair(register_workflow: Any) -> list[ClaimedWork]:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    for key in ("a", "b"):
        enqueue(kind, {"key": key})
    return sorted(Claimer(kinds=[kind], using="default").claim_due(2), key=lambda work: work.id)


def saving(writer: JournalWriter, work: ClaimedWork, patch: dict[str, Any]) -> dict[str, Any]:
    """``writer.save`` on a thread of its own: its outcome under "result" or "error"."""
    from django.db import connection

    outcome: dict[str, Any] = {}

    def save() -> None:
        try:
            outcome["result"] = writer.save(work, patch)
        except BaseException as error:  # noqa: BLE001 - the test looks at it
            outcome["error"] = error
        finally:
            connection.close()

    outcome["thread"] = threading.Thread(target=save, daemon=True)
    outcome["thread"].start()
    return outcome


def one_batch(writer: JournalWriter, pairs: list[tuple[ClaimedWork, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The saves of ``pairs`` made at once and, before the writer starts, queued together:
    its first batch holds them all, in this order."""
    outcomes = [saving(writer, work, patch) for work, patch in pairs]
    wait_for(lambda: writer._waiting.qsize() == len(pairs), timeout=10, what="the saves to queue")
    writer.start()
    return outcomes


def checkpoints_of(*works: ClaimedWork) -> dict[int, Any]:
    rows = DeferredWork.objects.filter(pk__in=[work.id for work in works])
    return dict(rows.values_list("pk", "checkpoints"))


@pytest.mark.needs("row_locks")
def test_a_row_another_session_holds_holds_back_no_other_save_of_its_batch(register_workflow: Any) -> None:
    """No ``lock_timeout``: the batch skips the held row and writes the other at once; the
    held row's save waits and is written once the lock goes. On the old code the whole
    batch waited for the lock (an operator's open transaction held up to 200 attempts)."""
    first, second = claimed_pair(register_workflow)
    writer = JournalWriter("default", 1)
    try:
        with row_locked(DeferredWork, second.id) as release:
            free, held = one_batch(writer, [(first, {"step": 1}), (second, {"step": 2})])
            wait_for(lambda: not free["thread"].is_alive(), timeout=10, what="the free row's save")
            assert free == {"thread": free["thread"], "result": {"step": 1}}
            assert held["thread"].is_alive()  # still waiting for the lock
            assert checkpoints_of(first, second) == {first.id: {"step": 1}, second.id: {}}
            release()
            wait_for(lambda: not held["thread"].is_alive(), timeout=10, what="the held row's save")
        assert held["result"] == {"step": 2}
        assert checkpoints_of(first, second) == {first.id: {"step": 1}, second.id: {"step": 2}}
    finally:
        writer.stop()


@pytest.mark.needs("row_locks")
def test_a_held_rows_save_whose_claim_is_lost_meanwhile_raises_claim_lost(register_workflow: Any) -> None:
    """The session that held the row took the work (an operator's revive, another runner):
    the save put off finds its claim gone once the lock goes, as a waiting statement would."""
    from nexus_workflows.exceptions import ClaimLost

    (work,) = claimed_pair(register_workflow)[:1]
    writer = JournalWriter("default", 1)
    try:
        with row_changed(DeferredWork, work.id, "claim_token = 'someone else'") as commit:
            (saved,) = one_batch(writer, [(work, {"step": 1})])
            wait_for(
                lambda: lock_waits() >= 1, timeout=10, interval=0.2, what="the save to wait for the lock"
            )
            commit()
        wait_for(lambda: not saved["thread"].is_alive(), timeout=10, what="the save")
    finally:
        writer.stop()
    assert isinstance(saved["error"], ClaimLost)
    assert checkpoints_of(work) == {work.id: {}}


@pytest.mark.needs("row_locks")
def test_a_stop_fails_a_held_rows_save_at_once(register_workflow: Any) -> None:
    """A save put off for a lock is failed by the stop (ClaimLost: "the runner stopped"),
    not left to its writer, which on the old code was stuck in the statement until the
    stop gave up on it (STOP_WAIT)."""
    from nexus_workflows.deferred.runner import journal
    from nexus_workflows.exceptions import ClaimLost

    (work,) = claimed_pair(register_workflow)[:1]
    writer = JournalWriter("default", 1)
    with row_locked(DeferredWork, work.id):
        (saved,) = one_batch(writer, [(work, {"step": 1})])
        # Taken by the writer: put off now (or, on the old code, waiting in its statement).
        wait_for(lambda: writer._waiting.qsize() == 0, timeout=10, what="the writer to take the save")
        began = time.monotonic()
        writer.stop()
        stopping = time.monotonic() - began
        wait_for(lambda: not saved["thread"].is_alive(), timeout=10, what="the save")
    assert isinstance(saved["error"], ClaimLost)
    assert "the runner stopped" in str(saved["error"])
    assert stopping < journal.STOP_WAIT / 2
    assert checkpoints_of(work) == {work.id: {}}


@contextlib.contextmanager
def session_limits(statements: dict[str, str]) -> Iterator[str]:
    """Within the block, every new connection of the test database runs the statement of its
    vendor (a session setting, as a production role has), the writers' own included; yields
    the vendor."""
    from django.db import connection
    from django.db.backends.signals import connection_created

    def limit(sender: Any, connection: Any, **kwargs: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute(statements[connection.vendor])

    connection_created.connect(limit, weak=False)
    connection.close()
    try:
        yield connection.vendor
    finally:
        connection_created.disconnect(limit)
        connection.close()  # the session's setting goes with it


@pytest.mark.needs("row_locks")
def test_a_row_locked_again_and_again_gets_its_save_written(register_workflow: Any) -> None:
    """Another session locks the row in back-to-back transactions (a backfill's batches):
    it is never free between two of them. The held save waits in the lock's queue, so it
    gets the row at one of their commits; a save that only skipped and tried again (this
    change's first version) waited until the locking stopped."""
    from django.db import connection

    (work,) = claimed_pair(register_workflow)[:1]
    stop, locking = threading.Event(), threading.Event()

    def lock_again_and_again() -> None:
        """One session, each transaction begun as the last one commits."""
        table = connection.ops.quote_name(TABLE)
        if connection.vendor == "mysql":
            import MySQLdb

            session = MySQLdb.connect(**connection.get_connection_params())
            session.autocommit(True)
            run = session.cursor().execute
        else:
            session = raw_connection()
            run = session.execute
        try:
            while not stop.is_set():
                run("BEGIN")
                run(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [work.id])
                locking.set()
                stop.wait(0.2)
                run("COMMIT")
        finally:
            session.close()

    locker = threading.Thread(target=lock_again_and_again, daemon=True)
    locker.start()
    writer = JournalWriter("default", 1)
    try:
        wait_for(locking.is_set, timeout=10, what="the locking")
        (saved,) = one_batch(writer, [(work, {"step": 1})])
        wait_for(lambda: not saved["thread"].is_alive(), timeout=20, what="the save, the locking going on")
        assert locker.is_alive()
    finally:
        stop.set()
        locker.join(10)
        writer.stop()
    assert saved["result"] == {"step": 1}
    assert checkpoints_of(work) == {work.id: {"step": 1}}


@pytest.mark.needs("row_locks")
def test_a_held_rows_save_fails_once_it_has_waited_the_sessions_statement_timeout(
    register_workflow: Any,
) -> None:
    """``statement_timeout`` (MariaDB: ``max_statement_time``) ended a save's wait for a
    lock before; it still does for a held save, while the lock is still held: with the
    database's lock error, or, on MariaDB, whose least wait is a second, with the statement
    cancelled by ``max_statement_time`` when that comes first (as before)."""
    from django.db import OperationalError

    from nexus_workflows.database_errors import is_lock_wait_cut_short, is_query_canceled

    (work,) = claimed_pair(register_workflow)[:1]
    limits = {"postgresql": "SET statement_timeout = '1s'", "mysql": "SET SESSION max_statement_time = 1"}
    writer = JournalWriter("default", 1)
    try:
        with session_limits(limits), row_locked(DeferredWork, work.id):
            began = time.monotonic()
            (saved,) = one_batch(writer, [(work, {"step": 1})])
            wait_for(
                lambda: not saved["thread"].is_alive(), timeout=20, what="the save while the lock is held"
            )
            waited = time.monotonic() - began
    finally:
        writer.stop()
    assert isinstance(saved["error"], OperationalError)
    assert is_lock_wait_cut_short(saved["error"]) or is_query_canceled(saved["error"])
    assert waited >= 1.0
    assert checkpoints_of(work) == {work.id: {}}


@pytest.mark.postgresql
def test_a_row_a_trigger_leaves_unwritten_is_a_lost_claim_not_a_held_row(register_workflow: Any) -> None:
    """A project's trigger that leaves the row as it is (``RETURN NULL``): no lock anywhere.
    The save finds its claim lost, as before; this change's first version took the row for
    held and tried it for ever."""
    from django.db import connection

    from nexus_workflows.exceptions import ClaimLost

    (work,) = claimed_pair(register_workflow)[:1]
    writer = JournalWriter("default", 1)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION nw_test_freeze() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RETURN NULL; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER nw_test_freeze BEFORE UPDATE ON {TABLE} FOR EACH ROW "
            f"WHEN (NEW.id = {work.id} AND NEW.checkpoints <> OLD.checkpoints) "
            "EXECUTE FUNCTION nw_test_freeze()"
        )
    try:
        (saved,) = one_batch(writer, [(work, {"step": 1})])
        wait_for(lambda: not saved["thread"].is_alive(), timeout=10, what="the save")
    finally:
        writer.stop()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS nw_test_freeze ON {TABLE}")
    assert isinstance(saved["error"], ClaimLost)
    assert "no longer holds the work" in str(saved["error"])


#: The advisory lock the deadlock test's trigger waits for (a key no app code uses).
_CYCLE_LOCK = 0x6E77_6379


@pytest.mark.postgresql
def test_a_batch_ended_by_a_deadlock_is_written_again(
    register_workflow: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch skips rows others hold, so row locks alone no longer close a cycle with it;
    a project's trigger still can. Here the batch holds both rows and its trigger waits for
    a lock another session holds, which then updates the first row. That session's
    ``deadlock_timeout`` is long, so PostgreSQL ends the batch: it is written again at
    once (skipping the row the other session now holds, written once that one commits),
    and no save fails. Without the rerun both saves failed with the deadlock's error."""
    from django.db import connection

    first, second = claimed_pair(register_workflow)
    writer = JournalWriter("default", 1)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE OR REPLACE FUNCTION nw_test_cycle() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN PERFORM pg_advisory_xact_lock({_CYCLE_LOCK}); RETURN NEW; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER nw_test_cycle BEFORE UPDATE ON {TABLE} FOR EACH ROW "
            f"WHEN (NEW.id = {first.id} AND NEW.checkpoints <> OLD.checkpoints) "
            "EXECUTE FUNCTION nw_test_cycle()"
        )
    try:
        with raw_connection() as other, caplog.at_level(logging.INFO, logger="nexus_workflows"):
            other.execute("BEGIN")
            other.execute("SET LOCAL deadlock_timeout = '30s'")  # the batch's session detects it
            other.execute("SELECT pg_advisory_xact_lock(%s)", [_CYCLE_LOCK])
            saved = one_batch(writer, [(first, {"step": 1}), (second, {"step": 2})])
            wait_for(lambda: advisory_waits() == 1, timeout=10, what="the batch to wait in its trigger")
            # The batch holds the first row and waits for this session: this closes the cycle.
            other.execute(f"UPDATE {TABLE} SET heartbeat_at = now() WHERE id = %s", [first.id])
            other.execute("COMMIT")
            wait_for(lambda: not any(s["thread"].is_alive() for s in saved), timeout=30, what="the saves")
    finally:
        writer.stop()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS nw_test_cycle ON {TABLE}")
    assert [outcome.get("result") for outcome in saved] == [{"step": 1}, {"step": 2}]
    assert "a batch of 2 saves was not written (the database ended it to break a deadlock)" in caplog.text
    assert checkpoints_of(first, second) == {first.id: {"step": 1}, second.id: {"step": 2}}


def advisory_waits() -> int:
    with raw_connection() as watcher:
        row = watcher.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        ).fetchone()
        return int(row[0])


@pytest.fixture
def lock_wait_limit() -> Iterator[str]:
    """Every new connection of the test database waits at most 200 ms (PostgreSQL's
    ``lock_timeout``) or 1 s (MariaDB's ``innodb_lock_wait_timeout``) for a row lock, as a
    production role often does; the writer's own connections included."""
    limits = {"postgresql": "SET lock_timeout = '200ms'", "mysql": "SET SESSION innodb_lock_wait_timeout = 1"}
    with session_limits(limits) as vendor:
        yield vendor


@pytest.mark.needs("row_locks")
def test_a_held_rows_save_fails_with_the_databases_lock_error_after_the_sessions_limit(
    register_workflow: Any, lock_wait_limit: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock wait cut short (``lock_timeout``, ``innodb_lock_wait_timeout``) fails the
    held row's save with the database's own error (the attempt's refusal rules), once it
    has waited that long; the batch's other save is written at once. On the code before
    the last change every save of the batch failed (up to 200 attempts, for one row an
    operator held)."""
    from django.db import OperationalError

    from nexus_workflows.database_errors import is_lock_wait_cut_short

    first, second = claimed_pair(register_workflow)
    writer = JournalWriter("default", 1)
    limit = 1.0 if lock_wait_limit == "mysql" else 0.2
    try:
        with row_locked(DeferredWork, second.id), caplog.at_level(logging.INFO, logger="nexus_workflows"):
            began = time.monotonic()
            free, held = one_batch(writer, [(first, {"step": 1}), (second, {"step": 2})])
            wait_for(lambda: not free["thread"].is_alive(), timeout=10, what="the free row's save")
            wait_for(lambda: not held["thread"].is_alive(), timeout=10, what="the held row's save")
            waited = time.monotonic() - began
    finally:
        writer.stop()
    assert free["result"] == {"step": 1}
    assert isinstance(held["error"], OperationalError)
    assert is_lock_wait_cut_short(held["error"])
    assert waited >= limit
    assert "writing it again" not in caplog.text
    assert checkpoints_of(first, second) == {first.id: {"step": 1}, second.id: {}}


def test_a_batch_refused_for_one_rows_write_fails_only_that_save(
    register_workflow: Any, write_blocker: Any
) -> None:
    """On the old code both saves failed with the trigger's error: the whole batch."""
    first, second = claimed_pair(register_workflow)
    writer = JournalWriter("default", 1)
    saves = [Save(work, {"step": work.id}, written=threading.Event()) for work in (first, second)]
    write_blocker.install(f"NEW.id = {second.id}")
    writer._write(saves)
    assert saves[0].error is None
    assert isinstance(saves[1].error, DatabaseError)  # the trigger's (its type differs by vendor)
    checkpoints = dict(
        DeferredWork.objects.filter(pk__in=[first.id, second.id]).values_list("pk", "checkpoints")
    )
    assert checkpoints == {first.id: {"step": first.id}, second.id: {}}

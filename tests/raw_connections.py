"""psycopg connections of the test database's own, outside Django's: for a LISTEN, or to
watch sessions and locks while the code under test uses Django's connections; and a
session of the test database's own (PostgreSQL or MariaDB) that holds a row lock."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from django.db import connection
from django.db.backends.signals import connection_created

Callback = Callable[[], None]


def live_pids() -> set[int]:
    """Backend pids of every session on the test database now (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        return {row[0] for row in cursor.fetchall()}


@contextlib.contextmanager
def ended_when_idle(thread_name: str, timeout: str) -> Iterator[list[int]]:
    """Have the server end each session the thread ``thread_name`` opens on ``default``
    once it sits idle for ``timeout`` (PostgreSQL's ``idle_session_timeout``, set on that
    session only: an operator's, for the thread under test); yields their backend pids,
    in the order they were opened."""
    opened: list[int] = []

    def shorten_idle(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.alias == "default" and threading.current_thread().name == thread_name:
            opened.append(connection.connection.info.backend_pid)
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('idle_session_timeout', %s, false)", [timeout])

    connection_created.connect(shorten_idle, weak=False)
    try:
        yield opened
    finally:
        connection_created.disconnect(shorten_idle)


def raw_connection(**options: Any) -> Any:
    """An autocommit psycopg connection to the database ``connection`` points at, with
    Django's own connection parameters (``options`` override them)."""
    import psycopg

    params = dict(connection.get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    return psycopg.connect(**{**params, **options}, autocommit=True)


@contextlib.contextmanager
def row_locked(model: Any, pk: Any) -> Iterator[Callable[[], None]]:
    """Another session of the test database, outside Django's, locks the row ``pk`` of
    ``model`` (``SELECT … FOR UPDATE`` in a transaction it keeps open) until the block
    ends or it calls the ``release`` it yields (a rollback). PostgreSQL (psycopg) or
    MySQL/MariaDB (mysqlclient)."""
    table = connection.ops.quote_name(model._meta.db_table)
    with _open_transaction(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [pk]) as (release, _):
        yield release


@contextlib.contextmanager
def row_changed(model: Any, pk: Any, assignment: str) -> Iterator[Callable[[], None]]:
    """Another session changes the row ``pk`` of ``model`` (``UPDATE … SET assignment``) in a
    transaction it keeps open, holding the row's lock, until it calls the ``commit`` it
    yields (or the block ends: a rollback)."""
    table = connection.ops.quote_name(model._meta.db_table)
    with _open_transaction(f"UPDATE {table} SET {assignment} WHERE id = %s", [pk]) as (_, commit):
        yield commit


@contextlib.contextmanager
def _open_transaction(statement: str, params: list[Any]) -> Iterator[tuple[Callback, Callback]]:
    """A session of the test database's own that ran ``statement`` in a transaction it keeps
    open; yields its rollback and its commit."""
    if connection.vendor == "mysql":
        import MySQLdb

        session = MySQLdb.connect(**connection.get_connection_params())
        session.autocommit(True)
        cursor = session.cursor()
        cursor.execute("START TRANSACTION")
        cursor.execute(statement, params)
        release: Callable[[], None] = session.rollback
        commit: Callable[[], None] = session.commit
    else:
        session = raw_connection()
        session.execute("BEGIN")
        session.execute(statement, params)

        def release() -> None:
            session.execute("ROLLBACK")

        def commit() -> None:
            session.execute("COMMIT")

    try:
        yield release, commit
    finally:
        # Answered once the lock is gone: a close alone returns before the server releases it,
        # and the test's next statement could still find the row locked.
        with contextlib.suppress(Exception):  # a session already gone holds nothing
            release()
        session.close()


def lock_waits() -> int:
    """Statements of any session of this database waiting for a lock now (row or advisory; MariaDB: row or
    user lock). Poll MariaDB no faster than every 0.2 s: it refreshes ``INNODB_TRX`` only
    when its last read is over 0.1 s old, so quicker polls read the first answer for ever."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # This database's sessions only: bin/test's other stream runs its PgBouncer leg
            # on the same server at once.
            cursor.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = current_database()"
            )
        else:
            cursor.execute(
                "SELECT (SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT') "
                "+ (SELECT count(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock')"
            )
        return int(cursor.fetchone()[0])


#: The advisory lock :func:`updates_wait_for_a_lock` holds (a key no app code uses).
_TEST_LOCK = 0x6E77_7465


@contextlib.contextmanager
def updates_wait_for_a_lock(model: Any, condition: str) -> Iterator[Callable[[], None]]:
    """PostgreSQL: ``UPDATE``\\s of ``model``'s rows matching ``condition`` (SQL over
    ``NEW``/``OLD``) wait for a lock another session holds until the block ends or it
    calls the ``release`` it yields: a trigger takes an advisory lock the other session
    holds. A wait that ``SKIP LOCKED`` does not skip (the row itself is not locked), so a
    claim's statement meets the session's ``lock_timeout`` as a row lock used to make it.
    MariaDB: the same with a user lock (``GET_LOCK``) the other session holds."""
    table = connection.ops.quote_name(model._meta.db_table)
    if connection.vendor == "mysql":
        with _updates_wait_for_a_user_lock(table, condition) as release:
            yield release
        return
    holder = raw_connection()
    try:
        # Held by a transaction, not the session: behind PgBouncer in transaction mode a
        # session's lock stays on the server session, out of reach of the unlock (a later
        # transaction may run on another); the transaction keeps its server session.
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(%s)", [_TEST_LOCK])
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE OR REPLACE FUNCTION nw_test_lock_wait() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN PERFORM pg_advisory_xact_lock({_TEST_LOCK}); RETURN NEW; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER nw_test_lock_wait BEFORE UPDATE ON {table} FOR EACH ROW "
                f"WHEN ({condition}) EXECUTE FUNCTION nw_test_lock_wait()"
            )
        yield lambda: holder.rollback()
    finally:
        # Released and closed whatever failed, even while setting up: a lock left held
        # would hold every later test's updates of the table.
        try:
            holder.rollback()
        finally:
            holder.close()
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TRIGGER IF EXISTS nw_test_lock_wait ON {table}")


@contextlib.contextmanager
def _updates_wait_for_a_user_lock(table: str, condition: str) -> Iterator[Callable[[], None]]:
    """:func:`updates_wait_for_a_lock` on MariaDB: the trigger waits (up to an hour) for a
    user lock of the test database's name, which another session holds."""
    import MySQLdb

    name = f"nw_test_lock_wait_{connection.settings_dict['NAME']}"
    holder = MySQLdb.connect(**connection.get_connection_params())
    try:
        cursor = holder.cursor()
        cursor.execute("SELECT GET_LOCK(%s, 0)", [name])
        with connection.cursor() as ours:
            ours.execute(
                f"CREATE TRIGGER nw_test_lock_wait BEFORE UPDATE ON {table} FOR EACH ROW "
                f"BEGIN IF {condition} THEN DO GET_LOCK('{name}', 3600); DO RELEASE_LOCK('{name}'); "
                "END IF; END"
            )
        yield lambda: cursor.execute("DO RELEASE_LOCK(%s)", [name])
    finally:
        try:
            holder.close()  # a session's user locks go with it
        finally:
            with connection.cursor() as ours:
                ours.execute("DROP TRIGGER IF EXISTS nw_test_lock_wait")

"""Which database errors mean "the database cannot take this statement right now" (down,
unreachable, read-only, or it ended the session) rather than anything about the work, and
which mean "the database refused this statement" (a lock wait cut short, SQLite's
"database is locked" and "database table is locked" among them, a deadlock, a cancel by a time-out:
:func:`statement_refused`), which is no outage: the session is fine.
Used by the runner (:mod:`nexus_workflows.deferred.runner.unavailable`) and by its
observer, which must not import the runner; so is the one rerun such an error calls for
wherever no later turn renews the session (:func:`rerun_if_ended_idle`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connections

T = TypeVar("T")

#: Errors that mean "the database is not answering right now": wait and retry.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)

#: SQLSTATE of a write refused because the database is read-only for now: a hot standby
#: the DSN points at after a failover, or an operator's ``default_transaction_read_only``.
#: The DB-API files it under InternalError, not OperationalError, but it is no fault of
#: the work: wait and retry, on a new session (the old one keeps the setting it began with).
READ_ONLY_SQLSTATE = "25006"
#: SQLSTATE of a session the server ended because it sat idle (``idle_session_timeout``):
#: the statement that meets it never ran, and a new session runs it at once.
IDLE_SESSION_TIMEOUT_SQLSTATE = "57P05"
#: SQLSTATE of a session the server ended because it sat idle in a transaction
#: (``idle_in_transaction_session_timeout``); an InternalError too, but the session is
#: gone, as after ``pg_terminate_backend`` (an OperationalError).
IDLE_IN_TRANSACTION_SQLSTATE = "25P03"
#: SQLSTATE of a statement the server cancelled: its ``statement_timeout`` passed, or
#: someone called ``pg_cancel_backend`` (the two differ only in the message's text). The
#: session is fine; the statement took longer than the database lets it.
QUERY_CANCELED_SQLSTATE = "57014"
#: SQLSTATEs of a statement that met another transaction, by what each means: it waited
#: longer than its ``lock_timeout`` for a lock (``lock_not_available``), the server ended
#: it to break a deadlock, or under REPEATABLE READ or SERIALIZABLE it met a row changed
#: since its snapshot. DB-API files all three under OperationalError, but the database is
#: fine: the same statement may pass a moment later.
TRANSACTION_CONFLICTS = {
    "55P03": "it waited longer than lock_timeout for a lock",
    "40P01": "the database ended it to break a deadlock",
    "40001": "it met a concurrent update: serialization failure",
}
#: Those of them undone at once, not after a wait (:func:`is_deadlock`).
DEADLOCK_SQLSTATES = frozenset({"40P01", "40001"})


#: The same on MySQL and MariaDB, by the server's error number (mysqlclient gives no
#: SQLSTATE): a lock waited for longer than ``innodb_lock_wait_timeout`` (1205; only the
#: statement is undone, and in autocommit that is the transaction), and a deadlock (1213).
MYSQL_DEADLOCK = 1213
MYSQL_TRANSACTION_CONFLICTS = {
    1205: "it waited longer than innodb_lock_wait_timeout for a lock",
    MYSQL_DEADLOCK: "the database ended it to break a deadlock",
}

#: SQLite's result code of a statement that waited its connection's ``timeout`` for the
#: file's write lock another connection held (``database is locked``), by its primary code
#: (extended ones, ``SQLITE_BUSY_SNAPSHOT`` …, keep it in their low byte): the database
#: answered "busy", as a server's lock wait cut short does. No outage: the file is fine.
SQLITE_BUSY = 5
#: SQLite's result code of a statement that met a lock on a table another connection of
#: this process holds in the cache they share (``cache=shared`` in the database's URI:
#: ``database table is locked``, extended ``SQLITE_LOCKED_SHAREDCACHE``), or another
#: statement of the same connection holds. SQLite returns it at once (the ``timeout``
#: does not wait for it), but it is a refusal as busy is: the database answered, the
#: file is fine, and the same statement passes once the other transaction ends.
SQLITE_LOCKED = 6
SQLITE_REFUSALS = {
    SQLITE_BUSY: "another connection held the database file's write lock longer than timeout (SQLite busy)",
    SQLITE_LOCKED: "another connection sharing its cache (or statement) held a table's lock (SQLite locked)",
}


#: MySQL/MariaDB errors about the statement's values, which mysqlclient files under
#: OperationalError (it maps few server errors): the server answered and refused this
#: write, as a project's trigger or a strict SQL mode does. No outage: the same write
#: fails again however long the runner waits.
MYSQL_STATEMENT_REFUSED = {
    1292: "truncated incorrect value (strict mode)",
    1366: "incorrect value for its column (strict mode; text the column's charset lacks)",
    1644: "a trigger or procedure signalled an error (SIGNAL)",
    1690: "a value out of range",
    3140: "invalid JSON text",
    4038: "invalid JSON text",
}


#: SQLSTATE classes of an error about the session or the server, not the statement:
#: connection exceptions (08), insufficient resources (53: disk full, out of memory, too
#: many connections), operator intervention (57: a shutdown, a crash, a terminated session,
#: "cannot connect now"), system errors (58: I/O). Any other SQLSTATE says the server read
#: the statement and it cannot run (54: a program limit; 55: an object in use …).
SESSION_SQLSTATE_CLASSES = frozenset({"08", "53", "57", "58"})
#: SQLite's primary result codes that blame the statement, not the file: an SQL error
#: ("no such table", a syntax error), a value too big, a constraint, a type mismatch, an
#: API misuse, an authorizer's refusal, a parameter out of range.
SQLITE_STATEMENT_ERRORS = frozenset({1, 18, 19, 20, 21, 23, 25})
#: MySQL/MariaDB statement errors that mysqlclient files under OperationalError (it maps
#: few server errors): an unknown column, column counts that do not match, a subquery of
#: more than one row or column. The server read the statement and cannot run it.
MYSQL_STATEMENT_ERRORS = frozenset({1054, 1136, 1222, 1241, 1242})

#: MariaDB's error number of a statement its ``max_statement_time`` cancelled (MySQL's
#: ``max_execution_time`` is 3024): PostgreSQL's 57014.
MYSQL_STATEMENT_TIMEOUTS = {1969: "max_statement_time", 3024: "max_execution_time"}


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a database error (psycopg's ``sqlstate``, psycopg2's ``pgcode``),
    looked up on Django's wrapper and on the driver's error it wraps."""
    for candidate in (error, error.__cause__):
        code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(code, str):
            return code
    return None


def is_read_only(error: BaseException) -> bool:
    return sqlstate(error) == READ_ONLY_SQLSTATE


def session_ended_idle(error: BaseException) -> bool:
    return sqlstate(error) == IDLE_SESSION_TIMEOUT_SQLSTATE


def rerun_if_ended_idle(using: str, statements: Callable[[], T]) -> T:
    """``statements()``; once more at once, on a new session, when the server had ended
    this thread's session for sitting idle (``idle_session_timeout``: nothing of it ran).
    For a runner's stop, which has no later turn to renew the session in, and which may
    follow a long wait: the loop's, or one for running attempts. Other errors are raised,
    and so is this one inside a transaction: its earlier statements went with the session."""
    try:
        return statements()
    except Exception as error:
        if not session_ended_idle(error) or connections[using].in_atomic_block:
            raise
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        connections[using].close()
    return statements()


def is_query_canceled(error: BaseException) -> bool:
    """A statement the server cancelled: PostgreSQL's ``statement_timeout`` (or
    ``pg_cancel_backend``), MariaDB's ``max_statement_time``."""
    if sqlstate(error) == QUERY_CANCELED_SQLSTATE:
        return True
    return mysql_error_number(error) in MYSQL_STATEMENT_TIMEOUTS


def statement_refused(error: BaseException) -> str | None:
    """What ``error`` says when the database answered but did not run the statement: it
    met another transaction (:func:`transaction_conflict`: a lock waited for longer than
    ``lock_timeout`` or ``innodb_lock_wait_timeout``, a deadlock, a serialization
    failure) or the server cancelled it (``statement_timeout``, ``max_statement_time``).
    None for any other error. Not an outage: the session is fine, and the same
    statement may pass at the next try."""
    conflict = transaction_conflict(error)
    if conflict is not None:
        return conflict
    if is_query_canceled(error):
        number = mysql_error_number(error)
        setting = MYSQL_STATEMENT_TIMEOUTS[number] if number is not None else "statement_timeout"
        return f"the database cancelled it ({setting}?)"
    return None


def transaction_conflict(error: BaseException) -> str | None:
    """What ``error`` says when it is a statement meeting another transaction (see
    :data:`TRANSACTION_CONFLICTS`, :data:`MYSQL_TRANSACTION_CONFLICTS` and SQLite's
    :data:`SQLITE_REFUSALS`): "it waited longer than lock_timeout for a lock", …; None for
    any other error."""
    code = sqlstate(error)
    if code is not None:
        return TRANSACTION_CONFLICTS.get(code)
    sqlite_code = sqlite_result_code(error)
    if sqlite_code in SQLITE_REFUSALS:
        return SQLITE_REFUSALS[sqlite_code]
    number = mysql_error_number(error)
    return MYSQL_TRANSACTION_CONFLICTS.get(number) if number is not None else None


def is_deadlock(error: BaseException) -> bool:
    """Whether the database ended the statement to break a deadlock (or, under REPEATABLE
    READ or SERIALIZABLE, for a serialization failure): undone whole at once, and the same
    statement may pass when run again at once. A lock wait cut short is not one: it has
    waited its whole timeout already."""
    return sqlstate(error) in DEADLOCK_SQLSTATES or mysql_error_number(error) == MYSQL_DEADLOCK


def is_lock_wait_cut_short(error: BaseException) -> bool:
    """Whether the statement waited longer than ``lock_timeout`` (PostgreSQL) or
    ``innodb_lock_wait_timeout`` (MySQL/MariaDB) for a row another session holds."""
    return sqlstate(error) == "55P03" or mysql_error_number(error) == 1205


def sqlite_busy(error: BaseException) -> bool:
    """Whether ``error`` is SQLite's ``database is locked`` (:data:`SQLITE_BUSY`), on
    Django's wrapper or the driver's error it wraps."""
    return sqlite_result_code(error) == SQLITE_BUSY


def sqlite_result_code(error: BaseException) -> int | None:
    """The primary result code of an SQLite error (:data:`SQLITE_BUSY`,
    :data:`SQLITE_LOCKED` …: extended codes keep it in their low byte), on Django's
    wrapper or the driver's error it wraps; None for any other driver's."""
    # The error itself first: a driver's error raised while another was handled has that
    # other one as its context.
    for driver in (error, error.__cause__, error.__context__):
        if driver is not None and type(driver).__module__ == "sqlite3":
            break
    else:
        return None
    code = getattr(driver, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def mysql_error_number(error: BaseException) -> int | None:
    """The server's error number of a MySQL/MariaDB error (mysqlclient's, which Django's
    wrapper keeps as ``args[0]``); None for any other driver's. Django raises some (a failed
    CHECK, 4025) as its own ``IntegrityError`` while handling the driver's: that one is its
    context, not its cause."""
    driver = error.__cause__ or error.__context__ or error
    if type(driver).__module__.partition(".")[0] != "MySQLdb":
        return None
    number = error.args[0] if error.args else None
    return number if isinstance(number, int) else None


def is_database_unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the database cannot take the statement right now (down,
    unreachable, read-only, or it ended the session), rather than anything about the work.
    A statement the database refused while its session stays fine (:func:`statement_refused`:
    a lock wait cut short, a deadlock, a cancel) is none: the database answered; nor is a
    MySQL/MariaDB refusal of the statement's values (:data:`MYSQL_STATEMENT_REFUSED`)."""
    if statement_refused(error) is not None or mysql_error_number(error) in MYSQL_STATEMENT_REFUSED:
        return False
    return isinstance(error, DATABASE_UNAVAILABLE) or sqlstate(error) in (
        READ_ONLY_SQLSTATE,
        IDLE_IN_TRANSACTION_SQLSTATE,
    )


def describe_unavailable(error: BaseException) -> str:
    """The error's type for a log line, with the driver's more specific one when it has
    one ("OperationalError: DiskFull", "OperationalError: AdminShutdown"), and "read-only"
    when that is the cause. Never the driver's text: it may quote a statement."""
    name = type(error).__name__
    if is_read_only(error):
        return f"{name}: the database is read-only"
    cause = type(error.__cause__).__name__ if error.__cause__ is not None else name
    return f"{name}: {cause}" if cause != name else name


def blames_the_statement(error: BaseException) -> bool:
    """Whether the database read the statement and answered that it cannot run, while the
    session and the database are fine: SQLite's "no such table", PostgreSQL's
    ``program_limit_exceeded``, MariaDB's unknown column. DB-API files these under
    ``OperationalError`` too, so :func:`is_database_unavailable` takes them for an outage;
    a ``prepare`` whose own query fails so is no outage: the same query fails again. An
    error of no known code (the driver's own: a connection lost) never blames the
    statement."""
    code = sqlstate(error)
    if code is not None:
        return code[:2] not in SESSION_SQLSTATE_CLASSES and code not in (
            READ_ONLY_SQLSTATE,
            IDLE_IN_TRANSACTION_SQLSTATE,
        )
    if sqlite_result_code(error) in SQLITE_STATEMENT_ERRORS:
        return True
    return mysql_error_number(error) in MYSQL_STATEMENT_ERRORS

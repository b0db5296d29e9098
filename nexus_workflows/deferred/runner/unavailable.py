"""Which errors mean "the database is not answering right now"."""

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


def is_database_unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the database cannot take the statement right now (down,
    unreachable, read-only, or it ended the session), rather than anything about the work."""
    return isinstance(error, DATABASE_UNAVAILABLE) or sqlstate(error) in (
        READ_ONLY_SQLSTATE,
        IDLE_IN_TRANSACTION_SQLSTATE,
    )


def rerun_on_a_new_connection(using: str, write: Callable[[], T]) -> T:
    """``write()``; when the database was unavailable to it, once more on a new
    connection. The connection may only have died while it sat idle (a server restarted
    since, or one that ends idle sessions) and a new one works at once; a real outage
    fails the second time too, and raises. Only for writes that may run twice: the
    first may have committed before its answer was lost."""
    try:
        return write()
    except Exception as error:
        if not is_database_unavailable(error):
            raise
    close_connection(using)
    return write()


def describe_unavailable(error: BaseException) -> str:
    """The error's type for a log line, with the driver's more specific one when it has
    one ("OperationalError: QueryCanceled", "OperationalError: DiskFull"), and "read-only"
    when that is the cause. Never the driver's text: it may quote a statement."""
    name = type(error).__name__
    if is_read_only(error):
        return f"{name}: the database is read-only"
    cause = type(error.__cause__).__name__ if error.__cause__ is not None else name
    return f"{name}: {cause}" if cause != name else name


def close_connection(using: str) -> None:
    """Drop this thread's connection so the next query reconnects."""
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        connections[using].close()

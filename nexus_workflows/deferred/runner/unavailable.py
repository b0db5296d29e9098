"""Which errors mean "the database is not answering right now"."""

from __future__ import annotations

import contextlib

from django.db import InterfaceError, OperationalError, connections

#: Errors that mean "the database is not answering right now": wait and retry.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)

#: SQLSTATE of a write refused because the database is read-only for now: a hot standby
#: the DSN points at after a failover, or an operator's ``default_transaction_read_only``.
#: The DB-API files it under InternalError, not OperationalError, but it is no fault of
#: the work: wait and retry, on a new session (the old one keeps the setting it began with).
READ_ONLY_SQLSTATE = "25006"


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


def is_database_unavailable(error: BaseException) -> bool:
    """Whether ``error`` says the database cannot take the statement right now (down,
    unreachable, or read-only), rather than anything about the work."""
    return isinstance(error, DATABASE_UNAVAILABLE) or is_read_only(error)


def describe_unavailable(error: BaseException) -> str:
    """The error's type for a log line, and "read-only" when that is the cause (never the
    driver's text: it may quote a statement)."""
    name = type(error).__name__
    return f"{name}: the database is read-only" if is_read_only(error) else name


def close_connection(using: str) -> None:
    """Drop this thread's connection so the next query reconnects."""
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        connections[using].close()

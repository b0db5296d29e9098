"""Which errors mean "the database is not answering right now"."""

from __future__ import annotations

import contextlib

from django.db import InterfaceError, OperationalError, connections

#: Errors that mean "the database is not answering right now": wait and retry.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)


def is_database_unavailable(error: BaseException) -> bool:
    return isinstance(error, DATABASE_UNAVAILABLE)


def close_connection(using: str) -> None:
    """Drop this thread's connection so the next query reconnects."""
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        connections[using].close()

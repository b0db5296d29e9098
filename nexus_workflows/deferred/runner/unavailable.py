"""The runner's side of database outages: which errors are one (see
:mod:`nexus_workflows.database_errors`), dropping a connection, and rerunning a write on a
new one."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

from django.db import connections

from nexus_workflows.database_errors import (
    DATABASE_UNAVAILABLE,
    describe_unavailable,
    is_database_unavailable,
    session_ended_idle,
)

T = TypeVar("T")

__all__ = [
    "DATABASE_UNAVAILABLE",
    "close_connection",
    "describe_unavailable",
    "is_database_unavailable",
    "rerun_on_a_new_connection",
    "session_ended_idle",
]


def close_connection(using: str) -> None:
    """Drop this thread's connection so the next query reconnects."""
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        connections[using].close()


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

"""The runner's side of database outages: which errors are one (see
:mod:`nexus_workflows.database_errors`), dropping a connection, rerunning a write on a
new one, and running again a write the database ended to break a deadlock."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from nexus_workflows.database_errors import (
    DATABASE_UNAVAILABLE,
    describe_unavailable,
    is_database_unavailable,
    is_deadlock,
    rerun_if_ended_idle,
    session_ended_idle,
    transaction_conflict,
)

T = TypeVar("T")

#: Times a write the database ended to break a deadlock is run again before its error is
#: raised (:func:`rerun_after_deadlocks`).
CONFLICT_RETRIES = 3

__all__ = [
    "CONFLICT_RETRIES",
    "DATABASE_UNAVAILABLE",
    "close_connection",
    "close_if_past_max_age",
    "describe_unavailable",
    "is_database_unavailable",
    "past_max_age",
    "rerun_after_deadlocks",
    "rerun_if_ended_idle",
    "rerun_on_a_new_connection",
    "session_ended_idle",
]


def close_connection(using: str) -> None:
    """Drop this thread's connection so the next query reconnects."""
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        connections[using].close()


def past_max_age(connection: BaseDatabaseWrapper) -> bool:
    """Whether the connection has outlived a positive ``CONN_MAX_AGE`` of its alias (None
    keeps it for ever; 0, which in a web process means "one request", keeps it for the
    thread's life here: a new connection per attempt would cost more than the attempt)."""
    max_age = connection.settings_dict.get("CONN_MAX_AGE")
    return bool(max_age) and connection.close_at is not None and time.monotonic() >= connection.close_at


def close_if_past_max_age(using: str) -> None:
    """Close this thread's connection to ``using`` if it outlived a positive
    ``CONN_MAX_AGE``, as Django does between requests: the runner's own threads (its loop,
    heartbeats, journal writers) call this where no transaction is open, so a long-lived
    runner's sessions are recycled as its workers' are. The next statement reconnects."""
    connection = connections[using]
    if connection.connection is not None and not connection.in_atomic_block and past_max_age(connection):
        close_connection(using)


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


def rerun_after_deadlocks(using: str, write: Callable[[], T], *, again: Callable[[str], None]) -> T:
    """``write()`` (:func:`rerun_on_a_new_connection`); again at once, up to
    :data:`CONFLICT_RETRIES` times, when the database ended it to break a deadlock: it was
    undone whole, and the other transaction of the cycle (the journal writer's batch, the
    heartbeat's beat or marks: they update the same rows, many in one statement, each in
    the order of its own plan) goes on, so the same write passes a moment later. ``again``
    gets what the database said, to log, before each rerun. Any other error, a lock wait
    cut short among them (it has waited its whole timeout already), is raised at once."""
    retries = 0
    while True:
        try:
            return rerun_on_a_new_connection(using, write)
        except Exception as error:
            if not is_deadlock(error) or retries == CONFLICT_RETRIES:
                raise
            retries += 1
            again(transaction_conflict(error) or "a deadlock")

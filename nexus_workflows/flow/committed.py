"""Taking a start of a ``rate_limited`` window outside the caller's transaction.

A start counts a call its caller is about to make, so it must count whether or not the
caller's transaction commits later (the call was made either way), and it must not keep
the window's row locked while that transaction stays open: every other process that
tries the row would wait for the lock, past its own ``timeout``. So inside a transaction
the start is taken on a connection of its own, in a helper thread, and committed at once.

SQLite is the exception: its one writer is the caller's open transaction, so a second
connection could only wait for it. There the start is taken in the caller's transaction
and counts only if that commits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from django.db import DatabaseError, connections

T = TypeVar("T")

# Threads that take starts for callers inside a transaction; each connects per start and
# closes after it, so no idle connection is left behind (nor kept by a test database).
_HELPERS = 4
_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None


def _helpers() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(_HELPERS, thread_name_prefix="nexus-workflows-rate")
        return _executor


def _on_own_connection(using: str, function: Callable[[], T]) -> T:
    try:
        return function()
    finally:
        connections[using].close()


def run_committed(using: str, function: Callable[[], T]) -> T:
    """``function()``, its writes to ``using`` committed when it returns: run here in
    autocommit mode, else on a connection of its own (except on SQLite, see above)."""
    connection = connections[using]
    in_transaction = connection.in_atomic_block or not connection.get_autocommit()
    if not in_transaction or connection.vendor == "sqlite":
        return function()
    return _helpers().submit(_on_own_connection, using, function).result()


def close_if_broken(using: str) -> None:
    """After a database error, outside a transaction: close this thread's connection if
    the error left it unusable, so that its next start reconnects. A thread that no
    request cycle and no runner check looks after (``asyncio.to_thread``'s, where README
    has an async prepare call the Airtable helpers) would otherwise fail every later start
    with "the connection is closed"."""
    connection = connections[using]
    if connection.connection is None or connection.in_atomic_block or not connection.autocommit:
        return
    with contextlib.suppress(DatabaseError):  # the caller raises its own error
        connection.close_if_unusable_or_obsolete()

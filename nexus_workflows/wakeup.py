"""Waking idle runners as soon as work is enqueued.

Polling alone makes an idle runner start new work up to ``POLL_INTERVAL`` late. On
PostgreSQL, a statement trigger on the work table sends ``NOTIFY nexus_workflows`` for every
``INSERT`` (so an enqueue costs no extra round trip; delivered at commit, dropped on
rollback), :func:`notify` sends one when existing work becomes due (revive, run now,
release), and every runner ``LISTEN``\\s on a connection of its own, so new work starts
within milliseconds. Runners in the same process are woken through an in-process event, on
every database. Other databases fall back to polling.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from django.db import connections, transaction

from .conf import app_settings

logger = logging.getLogger(__name__)

CHANNEL = "nexus_workflows"

_local_waiters: weakref.WeakSet[threading.Event] = weakref.WeakSet()
_local_waiters_lock = threading.Lock()


def add_local_waiter(event: threading.Event) -> None:
    with _local_waiters_lock:
        _local_waiters.add(event)


def remove_local_waiter(event: threading.Event) -> None:
    with _local_waiters_lock:
        _local_waiters.discard(event)


def _wake_local_waiters() -> None:
    with _local_waiters_lock:
        waiters = list(_local_waiters)
    for event in waiters:
        event.set()


def notify(using: str, *, inserted: bool = False) -> None:
    """Tell runners that work is due now; call after writing it on ``using``.

    ``inserted``: the work was just inserted, so on PostgreSQL the table's trigger has
    already sent the NOTIFY and only in-process runners need waking.
    """
    connection = connections[using]
    if connection.vendor == "postgresql" and not inserted and app_settings.WAKEUP:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])
    if _local_waiters:
        transaction.on_commit(_wake_local_waiters, using=using)


class PostgresListener(threading.Thread):
    """Sets ``event`` whenever a ``NOTIFY nexus_workflows`` arrives; reconnects after
    the database goes away."""

    def __init__(self, using: str, event: threading.Event) -> None:
        super().__init__(name="nexus-workflows-listener", daemon=True)
        self.using = using
        self.event = event
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def _connect(self) -> Any:
        import psycopg

        params = dict(connections[self.using].get_connection_params())
        for django_only in ("cursor_factory", "context"):
            params.pop(django_only, None)
        params["connect_timeout"] = params.get("connect_timeout") or 5
        connection = psycopg.connect(**params, autocommit=True)
        connection.execute(f"LISTEN {CHANNEL}")
        return connection

    def run(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                connection = self._connect()
            except Exception as error:  # noqa: BLE001 - any failure means "retry later"
                logger.warning(
                    "wake-up listener cannot connect (%s); polling until it can",
                    type(error).__name__,
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)
                continue
            backoff = 0.5
            # Work may have been enqueued while we were not listening.
            self.event.set()
            try:
                with connection:
                    while not self._stopping.is_set():
                        for _ in connection.notifies(timeout=0.5):
                            self.event.set()
            except Exception as error:  # noqa: BLE001
                if not self._stopping.is_set():
                    logger.warning(
                        "wake-up listener lost its connection (%s); reconnecting",
                        type(error).__name__,
                    )

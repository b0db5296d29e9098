"""The sync pool: ``CONCURRENCY`` threads that run attempts taken from the ledger."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import close_old_connections, connections
from django.db.backends.signals import connection_created

from nexus_workflows.deferred.execution import Outcome, Result, SavePatch, execute
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.runner.ledger import Ledger
from nexus_workflows.deferred.runner.unavailable import (
    close_connection,
    is_database_unavailable,
    past_max_age,
)
from nexus_workflows.deferred.transitions import ClaimedWork

#: Seconds a worker thread may sit idle before its next attempt checks that its
#: connections still answer (one ``SELECT 1`` each): a busy thread never pays for it.
IDLE_CHECK_AFTER = 1.0


def run_attempt(work: ClaimedWork, save_patch: SavePatch) -> Outcome:
    """Run one attempt; never raises (an unregistered kind is a failed attempt)."""
    try:
        return execute(registry.for_work(work), work, save_patch)
    except BaseException as error:  # noqa: BLE001 - e.g. the kind was unregistered
        return Outcome(work, Result.FAILED, error)


class _Opened(threading.local):
    """Whether a connection was opened on this thread (Django's ``connection_created``).
    A worker whose prepares never used the ORM has no connection to check, and asking
    Django which connections a thread holds costs two exceptions per alias (asgiref's
    ``Local``): a no-op drain paid about a twentieth of its CPU for it."""

    here = False


_opened = _Opened()
# Set once a thread opens a connection that another thread made (Django's thread
# sharing): which thread holds it is unknown then, so every thread checks from then on.
_opened_for_another = False


def _note_opened(sender: Any, connection: Any, **kwargs: Any) -> None:
    global _opened_for_another
    _opened.here = True
    if getattr(connection, "_thread_ident", None) not in (None, threading.get_ident()):
        _opened_for_another = True


connection_created.connect(_note_opened, weak=False, dispatch_uid="nexus_workflows.runner.pool")


def check_connections(using: str, outage: bool, idle: bool = False) -> None:
    """Before an attempt: close this thread's connections older than their alias's
    ``CONN_MAX_AGE`` (when positive: as Django does at a request's start), and replace
    those that saw errors, after an outage the runner's database connection, and after the
    thread sat ``idle`` (a server may end idle sessions: ``idle_session_timeout``) any of
    them, if it no longer answers. Costs no query unless one of those happened
    (``close_old_connections`` would also close a healthy connection on every attempt when
    ``CONN_MAX_AGE`` is 0)."""
    if not (idle or outage or _opened.here or _opened_for_another):
        return  # no connection of this thread was ever opened: none to close or check
    for connection in connections.all(initialized_only=True):
        if connection.connection is None or connection.in_atomic_block:
            continue
        if past_max_age(connection):
            close_connection(connection.alias)
        elif connection.errors_occurred or idle or (outage and connection.alias == using):
            try:
                if connection.is_usable():
                    connection.errors_occurred = False
                else:
                    connection.close()
            except Exception:  # noqa: BLE001 - a broken connection fails to close, too
                close_connection(connection.alias)


def failed_for_an_outage(outcome: Outcome) -> bool:
    return outcome.error is not None and is_database_unavailable(outcome.error)


def drop_connections_after(outcome: Outcome) -> None:
    """After a failed sync attempt: close this thread's connections that prepare left
    broken and, when it failed for an outage, every idle one (see
    :func:`close_idle_connections`)."""
    with contextlib.suppress(Exception):  # a broken connection fails to close, too
        if failed_for_an_outage(outcome):
            close_idle_connections()
        else:
            close_old_connections()


def close_idle_connections() -> None:
    """Close this thread's connections that no transaction holds: after an attempt that
    failed for an outage (a session that met a read-only database stays read-only however
    usable it looks, so only a new one sees it writable again), and when the async pool
    stops. On the async pool's ORM thread, which every async attempt shares, a connection
    inside another attempt's transaction stays."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            close_connection(connection.alias)


class SyncPool:
    """``size`` daemon threads; each takes queued work from the ledger, runs it, and hands
    the outcome to ``finished`` (which records it in the ledger), until the ledger is
    closed. ``save()`` goes through
    ``save_patch`` (the journal writer), so a thread opens a database connection only if
    its prepare uses the ORM itself; then it keeps it until the thread exits.

    ``started(work)`` is called when an attempt starts, ``outage_epoch()`` says whether
    an outage happened since the thread's last attempt (then its connection is checked).
    """

    def __init__(
        self,
        ledger: Ledger,
        size: int,
        *,
        using: str,
        started: Callable[[ClaimedWork], None],
        finished: Callable[[Outcome], None],
        outage_epoch: Callable[[], int],
        save_patch: SavePatch,
    ) -> None:
        self.ledger = ledger
        self.size = size
        self.using = using
        self._started = started
        self._finished = finished
        self._outage_epoch = outage_epoch
        self._save_patch = save_patch
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for number in range(self.size):
            thread = threading.Thread(target=self._work, name=f"nexus-workflows-worker-{number}", daemon=True)
            thread.start()
            self.threads.append(thread)

    def _work(self) -> None:
        epoch = self._outage_epoch()
        last_ended = time.monotonic()
        try:
            while (work := self.ledger.take()) is not None:
                idle = time.monotonic() - last_ended >= IDLE_CHECK_AFTER
                check_connections(self.using, outage=epoch != self._outage_epoch(), idle=idle)
                epoch = self._outage_epoch()
                self._started(work)
                outcome = run_attempt(work, self._save_patch)
                self._finished(outcome)  # into the ledger, unwritten (Ledger.finished)
                last_ended = time.monotonic()
                if outcome.result is not Result.SUCCEEDED:
                    drop_connections_after(outcome)
        finally:
            connections.close_all()

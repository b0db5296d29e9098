"""Purging finished work once ``RETENTION`` has passed.

Only done and abandoned rows are purged, ``RETENTION`` seconds after their last update;
pending and processing rows are never purged, however long an outage lasts. The dedupe
horizon is therefore the retention: until a finished row is purged, enqueueing its key
again does nothing (done) or revives it (abandoned). So a purge that cannot progress
stretches the horizon too: a batch the database cancels (``statement_timeout``) is tried
again smaller (:class:`.purge_batches.PurgeBatchSize`), never as an outage, and so is
one that meets another transaction (``lock_timeout``, a deadlock, a serialization failure).
The runner's batches wait for a lock at most ``lock_wait`` seconds on PostgreSQL and
MariaDB whatever the role's settings (``lock_waits_at_most`` of the backend's module):
a row lock held for long by another session would otherwise hold up its claims as long.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.db import OperationalError, connections, router, transaction

from nexus_workflows import sql
from nexus_workflows.clock import now_plus
from nexus_workflows.conf import app_settings
from nexus_workflows.database_errors import is_query_canceled, transaction_conflict
from nexus_workflows.deferred.purge_batches import PurgeBatchSize, halved
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.transitions import purge
from nexus_workflows.exceptions import InvalidPurgeOption
from nexus_workflows.flow import windows
from nexus_workflows.flow.claiming import window_name
from nexus_workflows.limits import MAX_BATCH_SIZE
from nexus_workflows.models import FINISHED_STATUSES, DeferredWork

logger = logging.getLogger(__name__)


def expiry_cutoff(now: datetime | None = None) -> Any:
    """Rows last updated before this are expired: by the database's clock, unless
    ``now`` is given."""
    retention = timedelta(seconds=app_settings.RETENTION)
    return now - retention if now is not None else now_plus(-retention)


def rate_periods() -> dict[str, float]:
    """The period of each registered workflow's rate window, by window name (the periods
    of ``rate_limited`` windows are known only to their callers)."""
    return {
        window_name(workflow.kind): workflow.flow.rate_limit[1]
        for workflow in registry
        if workflow.is_deferred and workflow.flow is not None and workflow.flow.rate_limit is not None
    }


def purge_batch(
    *,
    now: datetime | None = None,
    batch_size: int | None = None,
    using: str | None = None,
    prune: bool = True,
    lock_wait: float | None = None,
) -> int:
    """Delete at most one batch of expired rows; returns how many were deleted.

    Deleting by primary key in bounded batches keeps every statement short, so a large
    backlog never holds locks or blocks a runner for long. The ``DELETE`` itself re-checks
    status and expiry, so a row revived (or otherwise changed) after the ids were read is
    left alone. It is one statement, never Django's collector: that one deletes by primary
    key only (whenever any ``pre_delete``/``post_delete`` receiver is connected), so no
    delete signals are sent for purged rows, as ``QuerySet.update()`` sends no save signals.
    With nothing expired it prunes rate-window rows instead, unless ``prune`` is false.
    With ``lock_wait``, the ``DELETE`` waits at most that many seconds for a row lock
    another session holds (:func:`_lock_waits_at_most`); the read of the ids takes none.
    A ``batch_size`` other than a whole number from 1 (``None``: ``PURGE_BATCH_SIZE``), or a
    ``lock_wait`` other than a finite number above 0, raises :class:`.InvalidPurgeOption`
    before anything is read or deleted.
    """
    batch_size = app_settings.PURGE_BATCH_SIZE if batch_size is None else _checked_batch_size(batch_size)
    _check_lock_wait(lock_wait)
    using = using or router.db_for_write(DeferredWork)
    expired = DeferredWork.objects.using(using).expired(expiry_cutoff(now))
    ids: list[int] = []
    for status in FINISHED_STATUSES:
        # One status at a time: nw_expiry_idx's predicate implies "status IN (done,
        # abandoned)", so PostgreSQL drops that from the index condition and a read of
        # both would walk every finished row's entry for updated_at; an equality on its
        # first column reads only the expired entries.
        ids += expired.filter(status=status).values_list("pk", flat=True)[: batch_size - len(ids)]
        if len(ids) >= batch_size:
            break
    if not ids:
        if prune:
            # Nothing expired left: also drop rate-window rows unused for an hour (windows of
            # keys that came and went) that no longer count under their window's period.
            with _lock_waits_at_most(using, lock_wait):
                windows.prune(using=using, periods=rate_periods())
        return 0
    with _lock_waits_at_most(using, lock_wait):
        return purge(expired, ids)


def _checked_batch_size(batch_size: object) -> int:
    # bool is an int to Python, never a row count; the value itself is not echoed.
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise InvalidPurgeOption(
            f"batch_size must be a whole number of rows, at least 1 (or None for PURGE_BATCH_SIZE); "
            f"got a {type(batch_size).__name__}"
        )
    if batch_size < 1:
        raise InvalidPurgeOption(
            "batch_size must be at least 1 row (or None for PURGE_BATCH_SIZE); got a number below 1"
        )
    if batch_size > MAX_BATCH_SIZE:  # as PURGE_BATCH_SIZE: a batch's ids are one statement's parameters
        raise InvalidPurgeOption(
            f"batch_size must be at least 1 and at most {MAX_BATCH_SIZE:,} rows (or None for "
            "PURGE_BATCH_SIZE); got a larger number"
        )
    return batch_size


def _check_lock_wait(lock_wait: object) -> None:
    if lock_wait is None:
        return
    # bool is an int to Python, never a number of seconds; NaN compares false with 0.
    if isinstance(lock_wait, bool) or not isinstance(lock_wait, int | float) or not 0 < lock_wait < math.inf:
        raise InvalidPurgeOption(
            "lock_wait must be a finite number of seconds above 0, or None to wait as the "
            "session's own lock_timeout says"
        )


def _lock_waits_at_most(using: str, seconds: float | None) -> AbstractContextManager[Any]:
    """Statements that wait at most ``seconds`` for a lock where the database can say so
    (PostgreSQL: one short transaction with its own ``lock_timeout``); as they are with
    None, or in the caller's transaction."""
    return nullcontext() if seconds is None else sql.for_connection(using).lock_waits_at_most(using, seconds)


def purge_sized_batch(
    sizes: PurgeBatchSize,
    *,
    now: datetime | None = None,
    using: str | None = None,
    lock_wait: float | None = None,
    prune: bool = True,
) -> int | None:
    """One batch of ``sizes.size`` rows, reported to ``sizes``; how many rows it deleted,
    or ``None`` when the database cancelled it (SQLSTATE 57014, ``QueryCanceled``): the
    batch took longer than the database lets one statement, and ``sizes`` shrank, told the
    session's real ``statement_timeout`` where the database has one. A batch that meets
    another transaction raises its ``OperationalError`` (:func:`.database_errors.transaction_conflict`
    names it) and leaves ``sizes`` alone: its size did not cause it. With ``lock_wait``,
    its ``DELETE`` (and the prune's) waits at most that long for a lock (the runner's: see
    :func:`purge_batch`), so a lock held for long is such a conflict, not a stall.

    Inside the caller's transaction in a savepoint, so a cancel leaves that transaction
    usable; otherwise in autocommit, as before: a cancel leaves the session fine, and the
    read and the DELETE stay two transactions (one would hold the read's snapshot under
    REPEATABLE READ, and SQLite's deferred BEGIN would upgrade to a write lock mid-way).

    With nothing deleted it prunes rate-window rows too, saying so when that meets another
    transaction, unless ``prune`` is false (the runner prunes itself, to say it once:
    :func:`prune_rate_windows`).
    """
    using = using or router.db_for_write(DeferredWork)
    started = time.monotonic()
    try:
        with _savepoint_in_a_transaction(using):
            deleted = purge_batch(
                now=now, batch_size=sizes.size, using=using, prune=False, lock_wait=lock_wait
            )
    except OperationalError as error:
        if not is_query_canceled(error):
            raise
        sizes.cancelled(time.monotonic() - started, sql.for_connection(using).statement_timeout(using))
        return None
    sizes.completed(deleted, time.monotonic() - started)
    if not deleted and prune:
        # Outside the batch: a cancel of the prune (another table, one unbounded DELETE)
        # says nothing about the work table's batch size.
        _prune_rate_windows(using, lock_wait)
    return deleted


def _savepoint_in_a_transaction(using: str) -> AbstractContextManager[Any]:
    connection = connections[using]
    in_transaction = connection.in_atomic_block or not connection.get_autocommit()
    return transaction.atomic(using=using) if in_transaction else nullcontext()


#: What :func:`prune_rate_windows` returns when the database cancelled the prune.
PRUNE_CANCELLED = "the database cancelled it: statement_timeout?"


def _prune_rate_windows(using: str, lock_wait: float | None) -> None:
    setback = prune_rate_windows(using, lock_wait)
    if setback == PRUNE_CANCELLED:
        logger.warning(
            "pruning unused rate-window rows was cancelled by the database (statement_timeout?); "
            "trying again at the next purge"
        )
    elif setback is not None:
        logger.warning(
            "pruning unused rate-window rows did not pass (%s); trying again at the next purge",
            setback,
        )


def prune_rate_windows(using: str, lock_wait: float | None) -> str | None:
    """Drop rate-window rows unused for an hour that no longer count under their window's
    period, each ``DELETE`` waiting at most ``lock_wait`` seconds for a lock; what kept it
    from passing, for the caller to say (the runner says it once while it lasts): the
    other transaction it met (:func:`.database_errors.transaction_conflict`), or
    :data:`PRUNE_CANCELLED` (``statement_timeout``); else None."""
    _check_lock_wait(lock_wait)
    # A slot row can be locked for long too: a project's transaction that called
    # rate_limited() on a key unused for its period, and stays open.
    try:
        with _savepoint_in_a_transaction(using), _lock_waits_at_most(using, lock_wait):
            windows.prune(using=using, periods=rate_periods())
    except OperationalError as error:
        conflict = transaction_conflict(error)
        if conflict is not None:
            return conflict
        if not is_query_canceled(error):
            raise
        return PRUNE_CANCELLED
    return None


def purge_expired(*, now: datetime | None = None, using: str | None = None) -> int:
    """Delete every expired row, batch by batch; returns how many were deleted.

    Batches are sized as the runner's are (:class:`.purge_batches.PurgeBatchSize`): about
    ``PURGE_BATCH_SECONDS`` each, at most ``PURGE_BATCH_SIZE`` rows. A batch the database
    cancels is tried again at half the size; when even one row's is cancelled, raises
    ``OperationalError`` naming ``statement_timeout``. A batch that meets another
    transaction (``lock_timeout``, a deadlock, a serialization failure) is tried once more
    at once; when that fails too, its ``OperationalError`` is raised.

    Its batches wait for a lock as the session's own settings say (the role's
    ``lock_timeout``; none: as long as the lock is held), not at most the runner's bound:
    they hold up no claims, only their caller, which asked for every expired row gone.
    """
    sizes = PurgeBatchSize(app_settings.PURGE_BATCH_SIZE, float(app_settings.PURGE_BATCH_SECONDS))
    total = 0
    retried = False
    while True:
        size = sizes.size
        try:
            deleted = purge_sized_batch(sizes, now=now, using=using)
        except OperationalError as error:
            conflict = transaction_conflict(error)
            if conflict is None or retried:
                raise
            retried = True
            logger.warning("a purge batch did not pass (%s); trying it once more", conflict)
            continue
        retried = False
        if deleted is None:
            if sizes.size == size:
                raise OperationalError(
                    "the database cancelled the purge of a single expired row (SQLSTATE 57014: "
                    "its statement_timeout, or pg_cancel_backend): one row's DELETE takes longer "
                    "than statement_timeout allows; raise statement_timeout for this role or session"
                )
            logger.warning(halved(size, sizes.size))
            continue
        total += deleted
        if deleted < size:
            return total

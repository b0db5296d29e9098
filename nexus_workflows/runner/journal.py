"""The journal writer: every ``save()`` of a runner's attempts, batched and fenced, over a
bounded number of database connections.

An attempt's ``save(patch)`` validates the patch in its own thread (or task), hands the
merged journal to the writer and waits: sync prepares block on an event, ``async def``
prepares await a future of their own loop, so neither holds a connection. ``DB_WRITERS``
writer threads (each one connection) take whatever saves are waiting, up to
:data:`MAX_BATCH`, and write them in one fenced ``UPDATE`` and one commit: a row is
written only while the claim that took it is still held (id *and* claim token). A save
returns once its batch committed; a save whose fence failed raises :class:`ClaimLost` in
its attempt; a database error fails every save of its batch with that error (so the
runner's outage rules apply to the attempt as to any other ``OperationalError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.db.models import Case, F, JSONField, Q, Value, When
from django.db.models.functions import Coalesce

from .. import claims
from ..claims import ClaimedWork, validate_patch
from ..clock import DatabaseNow
from ..exceptions import ClaimLost
from ..models import DeferredWork, Status
from .unavailable import close_connection

logger = logging.getLogger("nexus_workflows.runner")

#: Most saves one statement writes: bounds the statement's size and one batch's latency.
MAX_BATCH = 200


@dataclass(eq=False)
class _Save:
    """One ``save()`` waiting for the writer; ``complete`` is called once, from a writer."""

    work: ClaimedWork
    checkpoints: dict[str, Any]
    complete: Callable[[BaseException | None], None]


def claim_lost(work: ClaimedWork) -> ClaimLost:
    return ClaimLost(
        f"{work.kind} #{work.id}: this attempt no longer holds the work (it was "
        "reclaimed or changed by someone else); checkpoints not saved"
    )


def stopped(work: ClaimedWork) -> ClaimLost:
    """The runner stopped before this save was written: the attempt must end (its claim
    is kept and goes stale, as for any attempt that outlived the shutdown grace)."""
    return ClaimLost(f"{work.kind} #{work.id}: the runner stopped; checkpoints not saved")


def write_batch(saves: list[_Save], using: str) -> set[int]:
    """Write ``saves`` (at most one per row) in one statement and one transaction; the ids
    whose fence held. Each row gets its merged journal and a fresh heartbeat, and counts
    as started (a save proves the attempt ran)."""
    fence = Q()
    for save in saves:
        fence |= Q(pk=save.work.id, claim_token=save.work.claim_token)
    rows = DeferredWork.objects.using(using).filter(fence, status=Status.PROCESSING)
    journal = Case(
        *(When(pk=save.work.id, then=Value(save.checkpoints, output_field=JSONField())) for save in saves),
        output_field=JSONField(),
    )
    changes = {
        "checkpoints": journal,
        "heartbeat_at": DatabaseNow(),
        "updated_at": DatabaseNow(),
        "started_at": Coalesce(F("started_at"), DatabaseNow()),
    }
    with transaction.atomic(using=using):
        if claims._can_return_from_update(using):
            return {row["pk"] for row in claims._update_returning(rows, changes, using, ("pk",))}
        # No RETURNING: one fenced UPDATE per save, still one commit.
        return {
            save.work.id
            for save in saves
            if rows.filter(pk=save.work.id).update(
                **{**changes, "checkpoints": Value(save.checkpoints, JSONField())}
            )
        }


class JournalWriter:
    """``size`` writer threads, each with one connection to ``using``; see the module.

    :meth:`save` (sync) and :meth:`save_async` may be called from any number of threads
    and event loops at once. :meth:`stop` ends the writers (closing their connections);
    saves still waiting then fail with :class:`ClaimLost`, and later saves (of attempts
    that outlived the shutdown grace, whose claims are kept) are written by the caller.
    """

    def __init__(self, using: str, size: int) -> None:
        self.using = using
        self.size = size
        self._waiting: queue.SimpleQueue[_Save | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._stopped = False

    def start(self) -> None:
        for number in range(self.size):
            thread = threading.Thread(target=self._run, name=f"nexus-workflows-journal-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stopped = True
        for _ in self._threads:
            self._waiting.put(None)
        for thread in self._threads:
            thread.join(5.0)
        self._fail_waiting()

    def save(self, work: ClaimedWork, patch: Any) -> dict[str, Any]:
        """Merge ``patch`` into the journal of ``work`` durably; returns the clean patch.
        Blocks until written; raises :class:`ClaimLost` or the database's error.

        After :meth:`stop` (an attempt that outlived the shutdown grace: its claim is
        kept), the save is written on the caller's own connection, still fenced.
        """
        clean = validate_patch(patch)
        merged = {**work.checkpoints, **clean}
        written = threading.Event()
        outcome: list[BaseException | None] = []

        def complete(error: BaseException | None) -> None:
            outcome.append(error)
            written.set()

        save = _Save(work, merged, complete)
        if self._stopped:
            self._write([save])
        else:
            self._waiting.put(save)
        written.wait()
        if outcome[0] is not None:
            raise outcome[0]
        work.checkpoints = merged
        return clean

    async def save_async(self, work: ClaimedWork, patch: Any) -> dict[str, Any]:
        """:meth:`save` for an ``async def`` prepare: awaits the write on its own loop."""
        clean = validate_patch(patch)
        merged = {**work.checkpoints, **clean}
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def complete(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(_settle, future, error)

        if self._stopped:
            # An attempt that outlived the grace: written as a sync one's is (a thread
            # for this rare case only; the writers are gone).
            return await asyncio.to_thread(self.save, work, patch)
        self._waiting.put(_Save(work, merged, complete))
        await future
        work.checkpoints = merged
        return clean

    def _run(self) -> None:
        try:
            while (first := self._waiting.get()) is not None:
                batch = self._gather(first)
                self._write(batch)
        finally:
            connections.close_all()

    def _gather(self, first: _Save) -> list[_Save]:
        """``first`` and whatever else waits, up to MAX_BATCH, one save per row (a later
        save of the same row waits for the next batch, which puts the stop sentinel back)."""
        batch, rows = [first], {first.work.id}
        while len(batch) < MAX_BATCH:
            try:
                save = self._waiting.get_nowait()
            except queue.Empty:
                break
            if save is None or save.work.id in rows:
                self._waiting.put(save)
                break
            batch.append(save)
            rows.add(save.work.id)
        return batch

    def _write(self, batch: list[_Save]) -> None:
        try:
            written = write_batch(batch, self.using)
        except Exception as error:  # noqa: BLE001 - the attempts decide (outage rules)
            close_connection(self.using)  # the next batch reconnects
            for save in batch:
                # One instance per attempt: each raises it in its own thread or task.
                save.complete(_own_copy(error))
            return
        for save in batch:
            save.complete(None if save.work.id in written else claim_lost(save.work))

    def _fail_waiting(self) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                save = self._waiting.get_nowait()
                if save is not None:
                    save.complete(stopped(save.work))


def _own_copy(error: BaseException) -> BaseException:
    try:
        return copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception that cannot be copied is shared
        return error


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():  # the attempt was cancelled meanwhile
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)

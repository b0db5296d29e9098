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
runner's outage rules apply to the attempt as to any other ``OperationalError``), except
a deadlock (with the runner's own heartbeat, say), after which the batch is written again
first (:func:`~nexus_workflows.deferred.runner.unavailable.rerun_after_deadlocks`), and a
refusal of what it wrote (a project's trigger), after which each save is written alone, so
that only the row at fault fails.

The few other statements of an ``async def`` attempt (a rate-limited kind's start and its
confirmation) run on a writer too (:meth:`JournalWriter.call_async`), so that they count
within ``DB_CONNECTIONS``: a thread of asyncio's default pool would keep a connection of
its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections

from nexus_workflows.database_errors import is_lock_wait_cut_short, statement_refused
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.runner.unavailable import (
    close_connection,
    close_if_past_max_age,
    is_database_unavailable,
    rerun_after_deadlocks,
)
from nexus_workflows.deferred.transitions import ClaimedWork, validate_patch
from nexus_workflows.exceptions import ClaimLost

logger = logging.getLogger("nexus_workflows.deferred.runner")

#: Most saves one statement writes: bounds the statement's size and one batch's latency.
MAX_BATCH = 200
#: Seconds :meth:`JournalWriter.stop` waits for all the writers together.
STOP_WAIT = 5.0


@dataclass(eq=False)
class _Save:
    """One ``save()`` waiting for the writer: a sync caller waits on ``written``, an async
    one on ``future`` (of ``loop``, whose result is the ``clean`` patch); ``error`` is what
    the save raises, if anything."""

    work: ClaimedWork
    checkpoints: dict[str, Any]
    clean: dict[str, Any] | None = None
    written: threading.Event | None = None
    future: asyncio.Future[dict[str, Any]] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    error: BaseException | None = None
    # Completed (its error, or none, is final and its caller woken): at most once, by
    # whichever comes first of its writer and a stop that gave up on that writer.
    completed: bool = False


#: Guards every ``_Save.completed`` (a writer and a stop may complete one save at once).
_completion = threading.Lock()


def _complete_once(saves: list[_Save], error_of: Callable[[_Save], BaseException | None]) -> None:
    """Complete those of ``saves`` not completed yet, each with ``error_of(save)``: a save
    a stop failed (its caller told ClaimLost) is not written again later by its stuck
    writer, nor is a written one failed by a stop that came after its writer."""
    with _completion:
        mine = [save for save in saves if not save.completed]
        for save in mine:
            save.completed = True
            save.error = error_of(save)
    _complete(mine)


@dataclass(eq=False)
class _Call:
    """A function an async attempt runs on a writer's connection; its result or error is
    set on ``future`` (of ``loop``)."""

    function: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop


def _complete(saves: list[_Save]) -> None:
    """Wake the callers of written (or failed) saves: sync ones one by one, async ones
    with one call per event loop (one wake-up of the loop for the whole batch)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Save]] = {}
    for save in saves:
        if save.loop is not None:
            by_loop.setdefault(save.loop, []).append(save)
        elif save.written is not None:
            save.written.set()
    for loop, settled in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, settled)


def _settle(saves: list[_Save]) -> None:
    for save in saves:
        if save.future is not None:
            if save.error is None:
                # Written: the next save merges onto it, whether or not this one's caller
                # still waits (see execution.execute_async).
                save.work.checkpoints = save.checkpoints
            _resolve(save.future, save.clean, save.error)


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the future's loop: its result or error, unless the awaiting attempt was
    cancelled meanwhile."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def claim_lost(work: ClaimedWork) -> ClaimLost:
    return ClaimLost(
        f"{work.kind} #{work.id}: this attempt no longer holds the work (it was "
        "reclaimed or changed by someone else); checkpoints not saved"
    )


def stopped(work: ClaimedWork) -> ClaimLost:
    """The runner stopped before this save was written: the attempt must end (its claim
    is kept and goes stale, as for any attempt that outlived the shutdown grace)."""
    return ClaimLost(f"{work.kind} #{work.id}: the runner stopped; checkpoints not saved")


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
        self._waiting: queue.SimpleQueue[_Save | _Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._stopped = False
        # Guards _stopped and the hand-over of saves: a save racing stop() is either
        # queued before the stop sentinels (so written or failed by it) or not at all.
        self._lock = threading.Lock()
        # The batch each writer is writing, by thread: failed at stop if still unwritten.
        self._in_hand: dict[int, list[_Save]] = {}

    def start(self) -> None:
        for number in range(self.size):
            thread = threading.Thread(target=self._run, name=f"nexus-workflows-journal-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """End the writers, waiting :data:`STOP_WAIT` seconds for all of them together (one
        stuck on a silent network must not hold the exit for long, nor each add its own
        wait); saves not written by then fail with :class:`ClaimLost` at once, also those
        a stuck writer holds."""
        with self._lock:
            self._stopped = True
            for _ in self._threads:
                self._waiting.put(None)
        deadline = time.monotonic() + STOP_WAIT
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._fail_in_hand()
        self._fail_waiting()

    def _enqueue(self, item: _Save | _Call) -> bool:
        """Hand ``item`` to the writers; False once they are stopping (the caller then
        writes it itself)."""
        with self._lock:
            if self._stopped:
                return False
            self._waiting.put(item)
            return True

    def save(self, work: ClaimedWork, patch: Any) -> dict[str, Any]:
        """Merge ``patch`` into the journal of ``work`` durably; returns the clean patch.
        Blocks until written; raises :class:`ClaimLost` or the database's error.

        After :meth:`stop` (an attempt that outlived the shutdown grace: its claim is
        kept), the save is written on the caller's own connection, still fenced.
        """
        clean = validate_patch(patch, work.using)
        written = threading.Event()
        save = _Save(work, {**work.checkpoints, **clean}, written=written)
        if not self._enqueue(save):
            self._write([save])
        written.wait()
        if save.error is not None:
            raise save.error
        work.checkpoints = save.checkpoints
        return clean

    def save_async(self, work: ClaimedWork, patch: Any) -> asyncio.Future[dict[str, Any]]:
        """:meth:`save` for an ``async def`` prepare: a future of the running loop, done
        (with the clean patch) once the save is written or failed, whether or not anyone
        still awaits it. Raises :class:`InvalidCheckpoint` at once."""
        if self._stopped:
            # An attempt that outlived the grace: written as a sync one's is (a thread
            # for this rare case only; the writers are gone).
            return asyncio.ensure_future(asyncio.to_thread(self.save, work, patch))
        clean = validate_patch(patch, work.using)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        if not self._enqueue(_Save(work, {**work.checkpoints, **clean}, clean, future=future, loop=loop)):
            future.cancel()  # the writers stopped meanwhile: written as after stop()
            return asyncio.ensure_future(asyncio.to_thread(self.save, work, patch))
        return future

    async def call_async(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on a writer thread (its connection), awaited on the
        caller's loop: a few statements of an async attempt. After :meth:`stop`, on a
        thread of its own (an attempt that outlived the grace, as for its saves)."""
        if self._stopped:
            return await asyncio.to_thread(function, *args)
        loop = asyncio.get_running_loop()
        call = _Call(function, args, loop.create_future(), loop)
        if not self._enqueue(call):
            return await asyncio.to_thread(function, *args)  # the writers stopped meanwhile
        return await call.future

    def _run(self) -> None:
        try:
            while (first := self._waiting.get()) is not None:
                close_if_past_max_age(self.using)  # between batches, as Django between requests
                if isinstance(first, _Call):
                    self._call(first)
                    continue
                batch = self._gather(first)
                with self._lock:
                    self._in_hand[threading.get_ident()] = batch
                try:
                    self._write(batch)
                finally:
                    with self._lock:
                        self._in_hand.pop(threading.get_ident(), None)
        finally:
            connections.close_all()

    def _call(self, call: _Call) -> None:
        result, error = None, None
        try:
            result = call.function(*call.args)
        except BaseException as raised:  # noqa: BLE001 - the attempt decides, as for a save
            error = raised
            if isinstance(raised, DatabaseError):
                close_connection(self.using)  # the next statement reconnects

        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            call.loop.call_soon_threadsafe(_resolve, call.future, result, error)

    def _gather(self, first: _Save) -> list[_Save]:
        """``first`` and whatever else waits, up to MAX_BATCH, one save per row (a later
        save of the same row waits for the next batch, which puts the stop sentinel back)."""
        batch, rows = [first], {first.work.id}
        while len(batch) < MAX_BATCH:
            try:
                save = self._waiting.get_nowait()
            except queue.Empty:
                break
            if save is None or isinstance(save, _Call) or save.work.id in rows:
                self._waiting.put(save)
                break
            batch.append(save)
            rows.add(save.work.id)
        return batch

    def _save_journals(self, journals: list[tuple[ClaimedWork, dict[str, Any]]], saves: int) -> set[int]:
        """The batch's statement; again at once when the database ended it to break a
        deadlock (the heartbeat and the start marks update the same rows, many in one
        statement each, in the order of their own plans). The database undid the statement
        whole, and a fenced save may be written twice; failing it would fail every attempt
        of the batch (up to MAX_BATCH) for no fault of theirs. A lock wait cut short is not
        retried: it has waited its whole timeout already."""
        return rerun_after_deadlocks(
            self.using,
            lambda: transitions.save_journals(journals, using=self.using),
            again=lambda said: logger.info(
                "a batch of %d saves was not written (%s); writing it again", saves, said
            ),
        )

    def _write(self, batch: list[_Save]) -> None:
        journals = [(save.work, save.checkpoints) for save in batch]
        try:
            # A writer's connection sits idle between batches: once more on a new one if
            # it died meanwhile (the same journals again: a second write changes nothing).
            written = self._save_journals(journals, len(batch))
        except Exception as error:  # noqa: BLE001 - the attempts decide (outage rules)
            close_connection(self.using)  # the next batch reconnects
            failed: BaseException = error
        else:
            _complete_once(batch, lambda save: None if save.work.id in written else claim_lost(save.work))
            return
        if len(batch) > 1 and refused_for_its_rows(failed):
            for save in batch:  # one row may be the cause: only its save fails
                self._write([save])
            return
        if len(batch) > 1 and is_lock_wait_cut_short(failed) and self._write_around_locks(batch, failed):
            return
        # One instance per attempt: each raises it in its own thread or task.
        _complete_once(batch, lambda save: _own_copy(failed))

    def _write_around_locks(self, batch: list[_Save], failed: BaseException) -> bool:
        """A batch whose wait for a row lock was cut short (``lock_timeout``): written again
        skipping the rows another session holds, whose saves alone fail, so a lock on one
        row fails its own attempt, not the batch's (up to MAX_BATCH). False: cannot skip."""
        journals = [(save.work, save.checkpoints) for save in batch]
        try:
            result = transitions.save_journals_around_locks(journals, using=self.using)
        except Exception as error:  # noqa: BLE001 - the attempts decide (outage rules)
            close_connection(self.using)
            again: BaseException = error
            _complete_once(batch, lambda save: _own_copy(again))
            return True
        if result is None:
            return False
        written, locked = result
        _complete_once(
            batch,
            lambda save: (
                _own_copy(failed)
                if save.work.id in locked
                else None
                if save.work.id in written
                else claim_lost(save.work)
            ),
        )
        return True

    def _fail_in_hand(self) -> None:
        """Fail the saves of writers still writing after the stop's wait: their callers
        end now (ClaimLost, the claim kept) instead of waiting for a silent network. A
        save its writer completed first keeps that writer's answer."""
        with self._lock:
            held = [save for batch in self._in_hand.values() for save in batch]
            self._in_hand.clear()
        _complete_once(held, lambda save: stopped(save.work))

    def _fail_waiting(self) -> None:
        failed, ends = [], 0
        with contextlib.suppress(queue.Empty):
            while True:
                save = self._waiting.get_nowait()
                if save is None:
                    ends += 1
                elif isinstance(save, _Call):
                    self._call(save)  # a start after the writers stopped: on this thread
                else:
                    failed.append(save)
        # The stop sentinels of writers still on a statement go back: each ends (closing its
        # connection) once its statement returns, instead of waiting for work for ever.
        for _ in range(ends):
            self._waiting.put(None)
        _complete_once(failed, lambda save: stopped(save.work))


def refused_for_its_rows(error: BaseException) -> bool:
    """Whether the database refused the statement for what it wrote (a project's trigger
    or constraint, a value the column does not take), which may be one row's fault: not an
    outage, and not a wait cut short (a lock, a deadlock, a cancel), which each row written
    alone would meet again, one timeout each."""
    return not is_database_unavailable(error) and statement_refused(error) is None


def _own_copy(error: BaseException) -> BaseException:
    try:
        copied = copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception that cannot be copied is shared
        return error
    # copy.copy drops the cause: the driver's error, whose SQLSTATE tells a read-only
    # database (an outage) from an error of the work (see nexus_workflows.database_errors).
    copied.__cause__ = error.__cause__
    return copied

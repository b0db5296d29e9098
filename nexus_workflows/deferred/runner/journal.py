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
a deadlock, after which the batch is written again first
(:func:`~nexus_workflows.deferred.runner.unavailable.rerun_after_deadlocks`), and a
refusal of what it wrote (a project's trigger), after which each save is written alone, so
that only the row at fault fails. A row another session holds a lock on is skipped, not
waited for, and its save written alone a moment later, waiting for the lock in bounded
turns (:mod:`~nexus_workflows.deferred.runner.held_saves`): one held row no longer holds
every other save of its batch back.

The few other statements of an ``async def`` attempt (a rate-limited kind's start and its
confirmation) run on a writer too (:meth:`JournalWriter.call_async`), so that they count
within ``DB_CONNECTIONS``: a thread of asyncio's default pool would keep a connection of
its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from django.db import DatabaseError, connections

from nexus_workflows.database_errors import statement_refused
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.runner.held_saves import BETWEEN_TRIES, IDLE_WAKE, HeldSaves, WritesHeldSaves
from nexus_workflows.deferred.runner.journal_saves import (
    Call,
    Save,
    claim_lost,
    complete_once,
    own_copy,
    resolve,
    stopped,
)
from nexus_workflows.deferred.runner.unavailable import (
    close_connection,
    close_if_past_max_age,
    is_database_unavailable,
    rerun_after_deadlocks,
    rerun_on_a_new_connection,
)
from nexus_workflows.deferred.transitions import ClaimedWork, JournalsWritten, validate_patch

logger = logging.getLogger("nexus_workflows.deferred.runner")

#: Most saves one statement writes: bounds the statement's size and one batch's latency.
MAX_BATCH = 200
#: Seconds :meth:`JournalWriter.stop` waits for all the writers together.
STOP_WAIT = 5.0


class JournalWriter(WritesHeldSaves):
    """``size`` writer threads, each with one connection to ``using``; see the module.

    :meth:`save` (sync) and :meth:`save_async` may be called from any number of threads
    and event loops at once. :meth:`stop` ends the writers (closing their connections);
    saves still waiting then fail with :class:`ClaimLost`, and later saves (of attempts
    that outlived the shutdown grace, whose claims are kept) are written by the caller.
    """

    def __init__(self, using: str, size: int) -> None:
        self.using = using
        self.size = size
        self._waiting: queue.SimpleQueue[Save | Call | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._stopped = False
        # Guards _stopped and the hand-over of saves: a save racing stop() is either
        # queued before the stop sentinels (so written or failed by it) or not at all.
        self._lock = threading.Lock()
        # The batch each writer is writing, by thread: failed at stop if still unwritten.
        self._in_hand: dict[int, list[Save]] = {}
        self._calls_in_hand: dict[int, Call] = {}
        self._held: HeldSaves[Save] = HeldSaves()

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
        complete_once(self._held.take_all(), lambda save: stopped(save.work))
        self._fail_waiting()

    def _enqueue(self, item: Save | Call) -> bool:
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
        save = Save(work, {**work.checkpoints, **clean}, written=written)
        if not self._enqueue(save):
            self._write_alone(save)
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
        if not self._enqueue(Save(work, {**work.checkpoints, **clean}, clean, future=future, loop=loop)):
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
        future = loop.create_future()
        if not self._enqueue(Call(function, args, future, loop)):
            return await asyncio.to_thread(function, *args)  # the writers stopped meanwhile
        return await future

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` on a writer's connection for another thread of the runner (the
        wake-up listener's probe and row updates: no connection beyond ``DB_CONNECTIONS``);
        after :meth:`stop`, on the caller's thread, whose connection is closed afterwards."""
        call = Call(function, args, done=(done := threading.Event()))
        if not self._enqueue(call):
            try:
                return function(*args)
            finally:
                connections[self.using].close()
        done.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def _run(self) -> None:
        try:
            while True:
                # Turn about: one put-off save whose wait is over, then what waits in line
                # (so neither starves the other).
                self._write_one_held()
                try:
                    first = self._waiting.get(timeout=self._held.seconds_to_next(at_most=IDLE_WAKE))
                except queue.Empty:
                    continue
                if first is None:
                    break
                close_if_past_max_age(self.using)  # between batches, as Django between requests
                if isinstance(first, Call):
                    with self._lock:  # a helper thread's call, failed by a stop that gives up on us
                        self._calls_in_hand[threading.get_ident()] = first
                    self._call(first)
                    with self._lock:
                        self._calls_in_hand.pop(threading.get_ident(), None)
                    continue
                batch = self._gather(first)
                with self._in_hand_of_this_writer(batch):
                    held = self._write(batch)
                self._put_off(held)
        finally:
            connections.close_all()

    @contextlib.contextmanager
    def _in_hand_of_this_writer(self, batch: list[Save]) -> Iterator[None]:
        """``batch`` is this writer's while the block runs: a stop that gives up on the
        writer (stuck on a silent network) fails its saves."""
        with self._lock:
            self._in_hand[threading.get_ident()] = batch
        try:
            yield
        finally:
            with self._lock:
                self._in_hand.pop(threading.get_ident(), None)

    def _write_alone(self, save: Save) -> None:
        """After :meth:`stop`, on the caller's own connection (see _write_held)."""
        if self._write([save]):
            while self._write_held(save):
                time.sleep(BETWEEN_TRIES)

    def _call(self, call: Call) -> None:
        result, error = None, None
        try:
            if call.done is not None:  # a helper thread's (a NOTIFY, the runner's row): may run twice
                result = rerun_on_a_new_connection(self.using, lambda: call.function(*call.args))
            else:
                result = call.function(*call.args)
        except BaseException as raised:  # noqa: BLE001 - the attempt decides, as for a save
            error = raised
            if isinstance(raised, DatabaseError):
                close_connection(self.using)  # the next statement reconnects

        if call.done is not None:
            if not call.done.is_set():  # a stop may have given up on it (_fail_in_hand)
                call.result, call.error = result, error
                call.done.set()
        elif call.loop is not None and call.future is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                call.loop.call_soon_threadsafe(resolve, call.future, result, error)

    def _gather(self, first: Save) -> list[Save]:
        """``first`` and whatever else waits, up to MAX_BATCH, one save per row (a later
        save of the same row waits for the next batch, which puts the stop sentinel back)."""
        batch, rows = [first], {first.work.id}
        while len(batch) < MAX_BATCH:
            try:
                save = self._waiting.get_nowait()
            except queue.Empty:
                break
            if save is None or isinstance(save, Call) or save.work.id in rows:
                self._waiting.put(save)
                break
            batch.append(save)
            rows.add(save.work.id)
        return batch

    def _save_journals(
        self, journals: list[tuple[ClaimedWork, dict[str, Any]]], saves: int
    ) -> JournalsWritten:
        """The batch's statement; again at once when the database ended it to break a
        deadlock (where a batch cannot skip locked rows, MariaDB before 10.6: the heartbeat
        and the start marks update the same rows, many in one statement each, in the order
        of their own plans). The database undid the statement whole, and a fenced save may
        be written twice; failing it would fail every attempt of the batch (up to MAX_BATCH)
        for no fault of theirs. A lock wait cut short (a table's lock: rows held by others
        are skipped) is not retried: it has waited its whole timeout already."""
        return rerun_after_deadlocks(
            self.using,
            lambda: transitions.save_journals(journals, using=self.using),
            again=lambda said: logger.info(
                "a batch of %d saves was not written (%s); writing it again", saves, said
            ),
        )

    def _write(self, batch: list[Save]) -> list[Save]:
        """Write ``batch`` and complete its saves, but for those whose row another session
        holds: returned, to be written on their own after a moment (:meth:`_put_off`)."""
        journals = [(save.work, save.checkpoints) for save in batch]
        try:
            # A writer's connection sits idle between batches: once more on a new one if
            # it died meanwhile (the same journals again: a second write changes nothing).
            result = self._save_journals(journals, len(batch))
        except Exception as error:  # noqa: BLE001 - the attempts decide (outage rules)
            close_connection(self.using)  # the next batch reconnects
            failed: BaseException = error
        else:
            held = [save for save in batch if save.work.id in result.held]
            complete_once(
                [save for save in batch if save.work.id not in result.held],
                lambda save: None if save.work.id in result.written else claim_lost(save.work),
            )
            now = time.monotonic()
            for save in held:
                save.held_since = save.held_since or now
            return held
        if len(batch) > 1 and refused_for_its_rows(failed):
            # One row may be the cause: only its save fails.
            return [held for save in batch for held in self._write([save])]
        # One instance per attempt: each raises it in its own thread or task.
        complete_once(batch, lambda save: own_copy(failed))
        return []

    def _fail_in_hand(self) -> None:
        """Fail the saves of writers still writing after the stop's wait: their callers
        end now (ClaimLost, the claim kept) instead of waiting for a silent network. A
        save its writer completed first keeps that writer's answer."""
        with self._lock:
            held = [save for batch in self._in_hand.values() for save in batch]
            self._in_hand.clear()
            calls = [call for call in self._calls_in_hand.values() if call.done is not None]
            self._calls_in_hand.clear()
        complete_once(held, lambda save: stopped(save.work))
        for call in calls:  # the listener's probe or row update: its thread must not wait for ever
            if call.done is not None and not call.done.is_set():
                call.error = RuntimeError("the runner stopped before its journal writer ended this call")
                call.done.set()

    def _fail_waiting(self) -> None:
        failed, ends = [], 0
        with contextlib.suppress(queue.Empty):
            while True:
                save = self._waiting.get_nowait()
                if save is None:
                    ends += 1
                elif isinstance(save, Call):
                    self._call(save)  # a start after the writers stopped: on this thread
                else:
                    failed.append(save)
        # The stop sentinels of writers still on a statement go back: each ends (closing its
        # connection) once its statement returns, instead of waiting for work for ever.
        for _ in range(ends):
            self._waiting.put(None)
        complete_once(failed, lambda save: stopped(save.work))


def refused_for_its_rows(error: BaseException) -> bool:
    """Whether the database refused the statement for what it wrote (a project's trigger
    or constraint, a value the column does not take), which may be one row's fault: not an
    outage, and not a wait cut short (a lock, a deadlock, a cancel), which each row written
    alone would meet again, one timeout each."""
    return not is_database_unavailable(error) and statement_refused(error) is None

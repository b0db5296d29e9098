"""The async pool: one event loop, owned by the runner, that runs ``async def`` prepares."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async

from nexus_workflows.deferred.execution import AsyncSavePatch, Outcome, Result, RunDb, execute_async
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.runner.ledger import ASYNC, Ledger
from nexus_workflows.deferred.runner.pool import (
    IDLE_CHECK_AFTER,
    check_connections,
    close_idle_connections,
    failed_for_an_outage,
)
from nexus_workflows.deferred.transitions import ClaimedWork

logger = logging.getLogger("nexus_workflows.deferred.runner")

# asyncio's own messages that carry no data of a prepare (others, such as "Exception in
# callback f(args)", embed the repr of the callback's arguments: not logged).
_PLAIN_LOOP_MESSAGES = frozenset(
    {
        "Task exception was never retrieved",
        "Future exception was never retrieved",
        "Task was destroyed but it is pending!",
        "Unhandled exception in event loop",
    }
)


def log_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: asyncio's default one logs the exception's message and
    traceback (a background task of a prepare failing with a patient's data in its
    message); this one logs the exception type alone."""
    message = context.get("message")
    error = context.get("exception")
    logger.error(
        "an async prepare left an error on the runner's event loop (%s: %s); details not "
        "logged, they may carry patient data",
        message if message in _PLAIN_LOOP_MESSAGES else "event loop error",
        type(error).__name__ if error is not None else "no exception",
    )


class AsyncPool:
    """One thread running one asyncio loop; up to ``size`` async attempts run on it at
    once as tasks (no thread, and no event loop, per attempt).

    :meth:`wake` (from any thread) makes the loop start queued async work from the
    ledger, as far as free slots allow; each finished attempt frees its slot and starts
    the next. ``started``/``finished`` are called on the loop thread, as the sync pool
    calls them on its workers. ``save_patch`` writes ``await save(...)`` and ``run_db``
    runs a rate-limited start (both the journal writer: no connection of the loop's
    own). :meth:`stop` lets attempts still running go on, as sync ones do (the runner's
    grace is over: they keep their claims, which go stale), and ends the loop once they
    are done.

    A prepare's own queries (``sync_to_async``, Django's async ORM methods) run on the one
    thread asgiref keeps for thread-sensitive calls, on its connection; before attempts
    start, :meth:`_check_orm_thread` checks that connection when a second has passed
    since its last check, or an outage since (``outage_epoch``), as the sync workers
    check theirs.
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
        save_patch: AsyncSavePatch,
        run_db: RunDb,
    ) -> None:
        self.ledger = ledger
        self.size = size
        self.using = using
        self._started = started
        self._finished = finished
        self._save_patch = save_patch
        self._run_db = run_db
        self._outage_epoch = outage_epoch
        # The last check of the ORM thread's connections: when it was queued, the outage
        # epoch then, and the check itself while it is queued or runs.
        self._orm_checked_at = -IDLE_CHECK_AFTER
        self._orm_checked_epoch = outage_epoch()
        self._orm_check: asyncio.Task[None] | None = None
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        # watch(): when the loop was last asked to answer and has not yet, and whether
        # its lateness was already said.
        self._ping_sent: float | None = None
        self._late_said = False
        self._thread = threading.Thread(target=self._run, name="nexus-workflows-async", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Start queued async work (thread-safe; returns at once)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: the runner stopped
            self._loop.call_soon_threadsafe(self._fill)

    def stop(self) -> None:
        """Start nothing more; end the loop when no attempt runs (from another thread)."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._stop_when_idle)

    def watch(self, late_after: float) -> None:
        """Heartbeat thread, once a beat: warn when the loop has not run a callback for
        ``late_after`` seconds. An ``async def`` prepare that blocks (``time.sleep``, a
        sync HTTP client, a CPU loop) holds every other async attempt back, and the work
        claimed for them stays held; heartbeats go on in their own thread, so nothing
        goes stale and nothing else would say so."""
        if not self._thread.is_alive():
            return  # never started (a runner of sync kinds only) or stopped: no loop to be late
        sent = self._ping_sent
        if sent is not None:
            late = time.monotonic() - sent
            if late >= late_after and not self._late_said:
                self._late_said = True
                logger.warning(
                    "the event loop of async prepares has not run for %.1f s: an async prepare "
                    "blocks it (a sync call in an async def?); %d async attempt(s) in flight wait",
                    late,
                    len(self._tasks),
                )
            return
        self._ping_sent = time.monotonic()
        with contextlib.suppress(RuntimeError):  # the loop is closed: the runner stopped
            self._loop.call_soon_threadsafe(self._pong)

    def _pong(self) -> None:
        sent = self._ping_sent
        if self._late_said and sent is not None:
            late = time.monotonic() - sent
            logger.warning("the event loop of async prepares runs again, after %.1f s", late)
        self._ping_sent = None
        self._late_said = False

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.set_exception_handler(log_loop_error)
        try:
            while True:
                try:
                    self._loop.run_forever()
                except (SystemExit, KeyboardInterrupt) as error:
                    # Only a task or callback a prepare left on the loop raises these out
                    # of it (an attempt's own are its outcome): the loop, and every other
                    # attempt on it, goes on; ended, they would hang with their claims.
                    logger.error(
                        "an async prepare left a task that raised %s on the runner's event "
                        "loop; ignored, the loop goes on",
                        type(error).__name__,
                    )
                    continue
                return  # stopped: no attempt runs any more
        finally:
            # A check still queued ends first: left pending, the task would be destroyed
            # with the loop.
            with contextlib.suppress(Exception):
                if self._orm_check is not None and not self._orm_check.done():
                    self._loop.run_until_complete(self._orm_check)
            # The ORM thread the attempts shared keeps its sessions until they are closed
            # (the sync workers' close as their threads end).
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(sync_to_async(close_idle_connections, thread_sensitive=True)())
            self._loop.close()

    def _fill(self) -> None:
        free = self.size - len(self._tasks)
        taken = self.ledger.take_now(ASYNC, free) if free > 0 else []
        if taken:
            self._check_orm_thread()
        for work in taken:
            task = self._loop.create_task(self._attempt(work))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _check_orm_thread(self) -> None:
        """Before attempts start: check the connections of the thread every async
        attempt's queries share, if a second has passed since the last check or an outage
        happened since (the server may have ended a session that sat idle:
        ``idle_session_timeout``, ``pg_terminate_backend``, a pooler's idle timeout); one
        that no longer answers is closed, and the next query opens a new one.

        The check is queued on that thread before any query of the attempts started after
        it: the task is created first, so its first step, which hands the check to the
        thread's executor, runs before theirs, and that executor runs calls in order. No
        attempt waits for it: one that makes no query starts even while another attempt
        holds the thread."""
        epoch = self._outage_epoch()
        now = time.monotonic()
        if now - self._orm_checked_at < IDLE_CHECK_AFTER and epoch == self._orm_checked_epoch:
            return
        if self._orm_check is not None and not self._orm_check.done():
            return  # still queued: the attempts' queries queue behind it anyway
        self._orm_checked_at, self._orm_checked_epoch = now, epoch
        self._orm_check = self._loop.create_task(self._check_orm_connections())

    async def _check_orm_connections(self) -> None:
        with contextlib.suppress(Exception):  # check_connections closes what fails
            await sync_to_async(check_connections, thread_sensitive=True)(self.using, False, idle=True)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if self._stopping:
            self._stop_when_idle()
        else:
            self._fill()

    def _stop_when_idle(self) -> None:
        self._stopping = True
        if not self._tasks:
            self._loop.stop()

    async def _attempt(self, work: ClaimedWork) -> None:
        self._started(work)
        try:
            outcome = await execute_async(registry.for_work(work), work, self._save_patch, self._run_db)
        except BaseException as error:  # noqa: BLE001 - e.g. the kind was unregistered
            outcome = Outcome(work, Result.FAILED, error)
        self._finished(outcome)  # into the ledger, unwritten (Ledger.finished)
        if outcome.result is not Result.SUCCEEDED:
            # prepare may have left a broken connection (an outage) on the thread the async
            # ORM and sync_to_async share: without this it would stay broken, failing every
            # later attempt that queries until the schedule is exhausted.
            # After an outage, new sessions: a read-only one stays read-only however
            # usable it looks, and would fail every later attempt (burning the schedule).
            with contextlib.suppress(Exception):
                if failed_for_an_outage(outcome):
                    await sync_to_async(close_idle_connections, thread_sensitive=True)()
                else:
                    await sync_to_async(check_connections, thread_sensitive=True)(self.using, False)

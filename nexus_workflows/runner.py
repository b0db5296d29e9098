"""The runner behind ``manage.py runworkflows``: claims due deferred work and runs it.

One runner is one process with a main thread and a few helpers:

* the **main thread** claims batches of due (and stale) work, hands them to the workers,
  writes every outcome (fenced on the claim), and purges expired rows in small batches;
* **worker threads** (``CONCURRENCY``) run ``prepare``; ``save(patch)`` writes from there;
* a **heartbeat thread** refreshes ``heartbeat_at`` of everything the runner holds, so a
  slow but live attempt is never reclaimed, and only a dead runner's work goes stale;
* on PostgreSQL, a **listener thread** wakes the main thread on ``NOTIFY``.

Any number of runners may share one database: claims are compare-and-set updates, so
no item is run twice at once. When the database goes away, the runner keeps what it has
not yet written, waits, reconnects and carries on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from queue import Empty, SimpleQueue
from types import FrameType
from typing import Any

from django.db import InterfaceError, OperationalError, close_old_connections, connections, router
from django.utils import timezone

from . import claims, retention, wakeup
from .claims import ClaimedWork, Claimer
from .conf import app_settings
from .exceptions import UnknownQueue, UnknownWorkflow, is_permanent
from .execution import Outcome, Result, execute
from .history import describe_error
from .models import DeferredWork
from .registry import registry
from .tasks import running as tasks_running

logger = logging.getLogger(__name__)

#: Errors that mean "the database is not answering right now": wait and retry.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)

# How much quick work a runner claims ahead of its free threads, in seconds of work per
# thread: enough to amortise the claim queries over many no-op items, nothing for slow
# items (which other runners should be free to take).
_PREFETCH_SECONDS = 0.05
_RUNTIME_SMOOTHING = 0.2
_MAX_BACKOFF = 10.0


@dataclass
class RunStats:
    done: int = 0
    rescheduled: int = 0
    abandoned: int = 0
    reclaimed: int = 0
    released: int = 0
    lost: int = 0
    purged: int = 0

    def summary(self) -> str:
        return (
            f"{self.done} done, {self.rescheduled} rescheduled, {self.abandoned} abandoned, "
            f"{self.reclaimed} reclaimed"
            + (f", {self.lost} lost" if self.lost else "")
            + (f", {self.released} released" if self.released else "")
            + (f", {self.purged} purged" if self.purged else "")
        )

    def as_dict(self) -> dict[str, int]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


def _selection(
    kinds: Sequence[str] | None, queues: Sequence[str] | None, deferred: list[str]
) -> tuple[list[str], list[str] | None]:
    """(workflow kinds, Django task queues or None for all) a runner takes: everything by
    default; only what was named when kinds or queues were."""
    allowed = tasks_running.configured_queues()
    if kinds is None and queues is None:
        return deferred, allowed
    unknown = [] if allowed is None else sorted(set(queues or ()) - set(allowed))
    if unknown:
        raise UnknownQueue(
            f"no Tasks backend of nexus_workflows allows queue(s) {', '.join(unknown)}; "
            f"their queues: {', '.join(allowed or ()) or 'none'}"
        )
    return sorted(set(kinds or ())), sorted(set(queues or ()))


def _worker_id() -> str:
    """This runner in a task's ``worker_ids``: host, process and a random part (a pid is
    reused after a restart), at most 64 characters."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _close_connection(using: str) -> None:
    """Drop this thread's connection so the next query reconnects."""
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        connections[using].close()


class Runner:
    """Runs deferred work until stopped (or, with ``once``, until nothing is due)."""

    def __init__(
        self,
        *,
        kinds: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        poll_interval: float | None = None,
        once: bool = False,
        using: str | None = None,
        install_signal_handlers: bool = True,
    ) -> None:
        deferred = registry.kinds(deferred=True)
        for kind in kinds or ():
            if kind not in deferred:
                raise UnknownWorkflow(
                    f"no deferred workflow is registered for kind {kind!r}; deferred kinds: "
                    f"{', '.join(deferred) or 'none'}"
                )
        self.kinds, self.queues = _selection(kinds, queues, deferred)
        self.concurrency = concurrency or app_settings.CONCURRENCY
        self.poll_interval = poll_interval or app_settings.POLL_INTERVAL
        self.once = once
        self.using = using or router.db_for_write(DeferredWork)
        self.install_signal_handlers = install_signal_handlers
        self.stale_after = timedelta(seconds=app_settings.STALE_AFTER)
        self.heartbeat_interval = float(app_settings.HEARTBEAT_INTERVAL)
        self.sweep_interval = float(app_settings.SWEEP_INTERVAL)
        self.batch_size = int(app_settings.BATCH_SIZE)
        self.shutdown_grace = float(app_settings.SHUTDOWN_GRACE)
        self.stats = RunStats()

        self.worker_id = _worker_id()
        self._claimer = Claimer(
            kinds=self.kinds, queues=self.queues, using=self.using, worker_id=self.worker_id
        )
        self._lock = threading.Lock()
        self._work_available = threading.Condition(self._lock)
        self._queued: deque[ClaimedWork] = deque()  # claimed, not started yet
        self._running: dict[int, ClaimedWork] = {}  # prepare in progress
        self._unwritten: list[Outcome] = []  # finished, outcome not written yet
        self._outcomes: SimpleQueue[Outcome] = SimpleQueue()
        self._workers_exit = False
        self._wake = threading.Event()
        self._stop_requested = threading.Event()
        self._stop_now = threading.Event()
        self._helpers_stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listener: wakeup.PostgresListener | None = None
        self._average_runtime: float | None = None
        self._outage_started: float | None = None
        self._backoff = 0.0

    # --- public -----------------------------------------------------------------------

    def run(self) -> RunStats:
        """Run until stopped; returns the counts of what happened."""
        previous_handlers = self._install_signal_handlers()
        self._start_threads()
        logger.info(
            "runner started: kinds %s, task queues %s, concurrency %d%s, worker id %s",
            ", ".join(self.kinds) or "(none)",
            "(all)" if self.queues is None else ", ".join(self.queues) or "(none)",
            self.concurrency,
            ", once" if self.once else "",
            self.worker_id,
        )
        try:
            self._loop()
        finally:
            try:
                self._shutdown()
            finally:
                self._restore_signal_handlers(previous_handlers)
        logger.info("runner stopped: %s", self.stats.summary())
        return self.stats

    def request_stop(self, *, now: bool = False) -> None:
        """Stop claiming; in-flight attempts get ``SHUTDOWN_GRACE`` seconds (none with
        ``now``), then their claims are released."""
        self._stop_requested.set()
        if now:
            self._stop_now.set()
        self._wake.set()

    # --- signals ----------------------------------------------------------------------

    def _install_signal_handlers(self) -> dict[int, Any]:
        if not self.install_signal_handlers or threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, self._handle_signal)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _handle_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stop_requested.is_set():
            logger.warning("second %s: releasing claims and stopping now", signal.Signals(signum).name)
            self.request_stop(now=True)
        else:
            logger.info(
                "%s: no new work is claimed; in-flight attempts have %gs to finish",
                signal.Signals(signum).name,
                self.shutdown_grace,
            )
            self.request_stop()

    # --- threads ----------------------------------------------------------------------

    def _start_threads(self) -> None:
        for number in range(self.concurrency):
            thread = threading.Thread(
                target=self._worker, name=f"nexus-workflows-worker-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        heartbeat = threading.Thread(
            target=self._heartbeat_loop, name="nexus-workflows-heartbeat", daemon=True
        )
        heartbeat.start()
        self._threads.append(heartbeat)
        wakeup.add_local_waiter(self._wake)
        if not self.once and app_settings.WAKEUP and connections[self.using].vendor == "postgresql":
            self._listener = wakeup.PostgresListener(self.using, self._wake)
            self._listener.start()

    def _worker(self) -> None:
        try:
            while True:
                with self._work_available:
                    while not self._queued and not self._workers_exit:
                        self._work_available.wait()
                    if not self._queued:
                        return
                    work = self._queued.popleft()
                    self._running[work.id] = work
                outcome = execute(registry.for_work(work), work)
                with self._lock:
                    self._running.pop(work.id, None)
                self._outcomes.put(outcome)
                self._wake.set()
                if outcome.result is not Result.SUCCEEDED:
                    # prepare may have left this thread's connection broken.
                    close_old_connections()
        finally:
            connections.close_all()

    def _heartbeat_loop(self) -> None:
        try:
            while not self._helpers_stop.wait(self.heartbeat_interval):
                held = self._held()
                if not held:
                    continue
                try:
                    claims.heartbeat(held, using=self.using)
                except DATABASE_UNAVAILABLE as error:
                    logger.warning(
                        "heartbeat failed (%s); retrying in %gs",
                        type(error).__name__,
                        self.heartbeat_interval,
                    )
                    _close_connection(self.using)
        finally:
            connections.close_all()

    def _held(self) -> list[ClaimedWork]:
        with self._lock:
            return [*self._queued, *self._running.values(), *(o.work for o in self._unwritten)]

    def _held_count(self) -> int:
        with self._lock:
            return len(self._queued) + len(self._running) + len(self._unwritten)

    # --- main loop --------------------------------------------------------------------

    def _loop(self) -> None:
        # --once runs what is due when it starts, so rescheduled work is not retried
        # within the same run.
        cutoff = timezone.now() if self.once else None
        next_stale_check = 0.0
        next_purge = 0.0
        stale_check_every = min(self.poll_interval, self.stale_after.total_seconds() / 4)
        while not self._stop_requested.is_set():
            self._wake.clear()
            claimed = 0
            more_due = False
            purging = False
            try:
                self._write_outcomes()
                if time.monotonic() >= next_purge:
                    deleted = retention.purge_batch(using=self.using)
                    self.stats.purged += deleted
                    purging = deleted >= app_settings.PURGE_BATCH_SIZE
                    next_purge = 0.0 if purging else time.monotonic() + self.sweep_interval
                if self._wants_more():
                    check_stale = time.monotonic() >= next_stale_check
                    if check_stale:
                        next_stale_check = time.monotonic() + stale_check_every
                    claimed, more_due = self._claim(cutoff, check_stale=check_stale)
                self._database_back()
            except DATABASE_UNAVAILABLE as error:
                self._database_lost(error)
                self._stop_requested.wait(self._backoff)
                continue
            if self.once and not claimed and not purging and self._held_count() == 0:
                return
            # Claim again at once only if the last claim may have left due work behind;
            # otherwise wait, so the workers start the work just claimed right away.
            if purging or (more_due and self._wants_more()):
                continue
            self._wake.wait(self.poll_interval)

    def _capacity(self) -> tuple[int, int]:
        """(most items to hold, refill when holding no more than this)."""
        prefetch = 0
        if self._average_runtime is not None:
            per_thread = _PREFETCH_SECONDS / max(self._average_runtime, 1e-6)
            prefetch = min(self.batch_size, int(self.concurrency * per_thread))
        return self.concurrency + prefetch, self.concurrency + prefetch // 2

    def _wants_more(self) -> bool:
        if self._stop_requested.is_set():
            return False
        _, low_water = self._capacity()
        return self._held_count() <= low_water and self._held_count() < self._capacity()[0]

    def _claim(self, cutoff: datetime | None, *, check_stale: bool) -> tuple[int, bool]:
        """Claim due work and, when a check is due, stale work; returns (items claimed,
        whether more may be waiting: a claim got all it asked for, or lost rows to another
        runner).

        Due work is handed to the workers before the stale check runs, so a wake-up for
        new work does not wait for it; the stale check may take up to ``concurrency`` rows
        beyond a full claim, so a busy runner still reclaims a dead runner's work.
        """
        limit = min(self._capacity()[0] - self._held_count(), max(self.batch_size, self.concurrency))
        due = self._claimer.claim_due(limit, now=cutoff) if limit > 0 else []
        self._dispatch(due)
        for work in due:
            self._log_outcome(work, "started", logging.INFO)
        more = 0 < limit <= len(due) or bool(due and self._claimer.contended)
        claimed = len(due)
        if check_stale:
            stale_limit = max(limit - len(due), self.concurrency)
            stale = self._claimer.claim_stale(stale_limit, stale_after=self.stale_after, now=cutoff)
            more = more or len(stale) >= stale_limit
            self.stats.reclaimed += len(stale)
            runnable = [work for work in stale if self._guard_crash_loop(work)]
            self._dispatch(runnable)
            claimed += len(runnable)
        return claimed, more

    def _dispatch(self, works: list[ClaimedWork]) -> None:
        if works:
            with self._work_available:
                self._queued.extend(works)
                self._work_available.notify(len(works))

    def _guard_crash_loop(self, work: ClaimedWork) -> bool:
        """Reclaimed work runs again unless its lost attempts used up the schedule."""
        workflow = registry.for_work(work)
        if work.attempt < workflow.max_attempts:
            self._log_outcome(work, "reclaimed from a runner that stopped heart-beating", logging.WARNING)
            return True
        error = (
            f"WorkerLost: the runner of attempt {work.attempt - 1} stopped heart-beating and "
            f"the retry schedule allows {workflow.max_attempts} attempts"
        )
        if claims.abandon(work, error=error, reason="lost too many times"):
            self.stats.abandoned += 1
            self._log_outcome(work, "abandoned (its runners kept dying)", logging.ERROR)
            tasks_running.send_finished([work], succeeded=False)
        else:
            self._log_lost(work)
        return False

    # --- outcomes ---------------------------------------------------------------------

    def _write_outcomes(self) -> None:
        while True:
            try:
                outcome = self._outcomes.get_nowait()
            except Empty:
                break
            self._observe_runtime(outcome.duration)
            with self._lock:
                self._unwritten.append(outcome)
        while self._unwritten:
            outcome = self._unwritten[0]
            if outcome.result is Result.SUCCEEDED:
                # Successes of one claim go in one statement; each batch leaves the list as
                # soon as it is written, so an outage half-way never writes one twice.
                batch = [
                    o
                    for o in self._unwritten
                    if o.result is Result.SUCCEEDED and o.work.claim_token == outcome.work.claim_token
                ]
                self._write_successes(batch)
                written = {id(o) for o in batch}
                with self._lock:
                    self._unwritten = [o for o in self._unwritten if id(o) not in written]
                continue
            self._write_failure(outcome)
            with self._lock:
                self._unwritten.pop(0)

    def _write_successes(self, batch: list[Outcome]) -> None:
        written, lost = claims.finish_done(o.work for o in batch)
        self.stats.done += len(written)
        for work in written:
            self._log_outcome(work, "done", logging.INFO)
        tasks_running.send_finished(written, succeeded=True)
        for work in lost:
            self._log_lost(work)

    def _write_failure(self, outcome: Outcome) -> None:
        work = outcome.work
        if outcome.result is Result.CLAIM_LOST:
            self._log_lost(work)
            return
        assert outcome.error is not None
        workflow = registry.for_work(work)
        error = describe_error(outcome.error)
        permanent = is_permanent(outcome.error)
        delay = None if permanent else workflow.delay_after(work.attempt)
        error_type = type(outcome.error).__name__
        if delay is None:
            reason = "permanent error" if permanent else "retry schedule exhausted"
            if claims.abandon(work, error=error, reason=reason):
                self.stats.abandoned += 1
                self._log_outcome(work, f"failed ({error_type}); abandoned: {reason}", logging.ERROR)
                tasks_running.send_finished([work], succeeded=False)
            else:
                self._log_lost(work)
        elif claims.reschedule(work, delay=delay, error=error):
            self.stats.rescheduled += 1
            self._log_outcome(
                work,
                f"failed ({error_type}); attempt {work.attempt + 1} in {delay.total_seconds():g}s",
                logging.WARNING,
            )
        else:
            self._log_lost(work)

    def _observe_runtime(self, duration: float) -> None:
        if self._average_runtime is None:
            self._average_runtime = duration
        else:
            self._average_runtime += _RUNTIME_SMOOTHING * (duration - self._average_runtime)

    def _log_outcome(self, work: ClaimedWork, outcome: str, level: int) -> None:
        # Kind, id, attempt and outcome only: triggers, checkpoints and error messages
        # may carry patient data and stay in the database.
        logger.log(
            level,
            "%s #%s attempt %d: %s",
            work.kind,
            work.id,
            work.attempt,
            outcome,
            extra={
                "workflow_kind": work.kind,
                "work_id": work.id,
                "attempt": work.attempt,
                "outcome": outcome,
            },
        )

    def _log_lost(self, work: ClaimedWork) -> None:
        self.stats.lost += 1
        self._log_outcome(
            work, "claim lost; result discarded (another runner or an operator took over)", logging.WARNING
        )

    # --- database outages -------------------------------------------------------------

    def _database_lost(self, error: BaseException) -> None:
        _close_connection(self.using)
        if self._outage_started is None:
            self._outage_started = time.monotonic()
            self._backoff = min(0.5, self.poll_interval)
            logger.warning(
                "database unavailable (%s); holding %d unwritten outcome(s) and retrying",
                type(error).__name__,
                len(self._unwritten),
            )
        else:
            self._backoff = min(self._backoff * 2, _MAX_BACKOFF)

    def _database_back(self) -> None:
        if self._outage_started is not None:
            logger.warning("database reachable again after %.1fs", time.monotonic() - self._outage_started)
            self._outage_started = None

    # --- shutdown ---------------------------------------------------------------------

    def _shutdown(self) -> None:
        with self._work_available:
            unstarted = list(self._queued)
            self._queued.clear()
            self._workers_exit = True
            self._work_available.notify_all()
        deadline = time.monotonic() + (0.0 if self._stop_now.is_set() else self.shutdown_grace)
        self._release(unstarted, deadline)
        while self._running_count() and time.monotonic() < deadline and not self._stop_now.is_set():
            self._wake.wait(0.05)
            self._wake.clear()
            self._try_write_outcomes()
        # Outcomes that arrived in time are written; attempts still running lose their claim.
        flush_deadline = max(deadline, time.monotonic() + min(self.shutdown_grace, 5.0))
        while not self._try_write_outcomes() and time.monotonic() < flush_deadline:
            time.sleep(0.2)
        with self._lock:
            still_running = list(self._running.values())
        self._release(still_running, flush_deadline)
        self._helpers_stop.set()
        wakeup.remove_local_waiter(self._wake)
        if self._listener is not None:
            self._listener.stop()
        _close_connection(self.using)

    def _running_count(self) -> int:
        with self._lock:
            return len(self._running)

    def _try_write_outcomes(self) -> bool:
        try:
            self._write_outcomes()
        except DATABASE_UNAVAILABLE as error:
            self._database_lost(error)
            return False
        return True

    def _release(self, works: Iterable[ClaimedWork], deadline: float) -> None:
        works = list(works)
        if not works:
            return
        while True:
            try:
                released = claims.release(works)
            except DATABASE_UNAVAILABLE as error:
                self._database_lost(error)
                if time.monotonic() >= deadline:
                    logger.error(
                        "could not release %d claim(s) before exiting; they will be reclaimed "
                        "after STALE_AFTER",
                        len(works),
                    )
                    return
                time.sleep(0.2)
                continue
            self.stats.released += released
            if released:
                with contextlib.suppress(*DATABASE_UNAVAILABLE):
                    wakeup.notify(self.using)  # another runner can start them at once
            logger.info(
                "released %d claim(s) at shutdown: pending again, due now, attempt unchanged",
                released,
            )
            return

"""The runner behind ``manage.py runworkflows``: claims due deferred work and runs it.

One runner is one process with a main thread and a few helpers:

* the **main thread** claims batches of due (and stale) work, hands them to the workers,
  writes every outcome (fenced on the claim), and purges expired rows in small batches;
* **worker threads** (``CONCURRENCY``) run ``prepare``; ``save(patch)`` writes from there;
* a **heartbeat thread** refreshes ``heartbeat_at`` of everything the runner holds, so a
  slow but live attempt is never reclaimed, and only a dead runner's work goes stale;
* on PostgreSQL, a **listener thread** wakes the main thread on ``NOTIFY``; it proves
  that wake-ups arrive, and while they do not the main thread polls every
  ``WAKEUP_FALLBACK_POLL_INTERVAL`` instead of ``POLL_INTERVAL`` (see :mod:`.wakeup`).

Any number of runners may share one database: claims are compare-and-set updates, so
no item is run twice at once. When the database goes away, the runner keeps what it has
not yet written, waits, reconnects and carries on. Nothing a workflow raises, and nothing
one outcome's write raises, ends the main loop: only a signal (or ``request_stop``) does.
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

from . import __version__, claims, retention, wakeup
from .attempts import attempt_number, describe_attempt
from .claims import ClaimedWork, Claimer
from .conf import app_settings
from .exceptions import UnknownQueue, UnknownWorkflow, is_permanent
from .execution import Outcome, Result, execute
from .flow import starts as flow_starts
from .history import describe_error
from .limits import OUTAGE_RELEASES_MAX, UNSTARTED_LOSSES_MAX
from .models import DeferredWork
from .observability.logs import start_line
from .observability.observer import Observer
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
# An attempt that failed because the database was unreachable runs again this soon.
_OUTAGE_RETRY_DELAY = timedelta(seconds=1)
# Start markers wait this long for company, so quick attempts (which finish first) cost
# no statement and slow ones are marked in one statement per batch.
_MARK_STARTED_DELAY = 0.1
_WRITE_RETRY_DELAY = 0.5
_WRITE_RETRY_MAX_DELAY = 60.0
# After this many failed writes of one failure outcome, its error text is replaced by
# the exception type alone: a message the database rejects must not pin the item.
_PLAIN_ERROR_AFTER = 2


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


def _is_database_unavailable(error: BaseException) -> bool:
    return isinstance(error, DATABASE_UNAVAILABLE)


@dataclass
class _Pending:
    """An outcome not written yet, and when its write may be tried again."""

    outcome: Outcome
    failures: int = 0
    retry_at: float = 0.0
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
        metrics_host: str = "127.0.0.1",
        metrics_port: int | None = None,
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
        # prepare in progress, by claim: a row may be reclaimed while an old attempt runs
        self._running: dict[tuple[str, int], ClaimedWork] = {}
        self._unmarked: dict[tuple[str, int], ClaimedWork] = {}  # started, marker not written
        self._unwritten: list[_Pending] = []  # finished, outcome not written yet
        self._unguarded: list[ClaimedWork] = []  # reclaimed, crash-loop guard not written yet
        self._mark_wanted = threading.Event()
        self._last_heartbeat = time.monotonic()  # last time the heartbeat was known good
        self._claims_paused = False
        self._outage_epoch = 0  # bumped by every outage: workers re-check their connection
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
        # Runner row, outcome counts, metrics and signals: see nexus_workflows.observability.
        self._observer = Observer(
            kinds=self.kinds,
            concurrency=self.concurrency,
            using=self.using,
            in_flight=self._running_count,
            wakeup_mode=lambda: self.wakeup_mode,
            metrics_host=metrics_host,
            metrics_port=metrics_port,
        )

    # --- public -----------------------------------------------------------------------

    def run(self) -> RunStats:
        """Run until stopped; returns the counts of what happened."""
        metrics = self._observer.start()  # first: a metrics port in use fails here, cleanly
        previous_handlers = self._install_signal_handlers()
        self._start_threads()
        logger.info(
            "runner started: %s",
            start_line(
                version=__version__,
                using=self.using,
                kinds=self.kinds,
                queues=self.queues,
                concurrency=self.concurrency,
                wakeup=self.describe_wakeup(),
                once=self.once,
                metrics=metrics,
                worker_id=self.worker_id,
            ),
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

    @property
    def wakeup_mode(self) -> wakeup.WakeupMode:
        """How this runner learns of new work (``listening`` once its probe arrived)."""
        return self._listener.mode if self._listener is not None else wakeup.WakeupMode.POLL

    def describe_wakeup(self) -> str:
        """The wake-up mode for the start line, with the interval it polls at."""
        mode = self.wakeup_mode
        if mode is wakeup.WakeupMode.LISTENING:
            return f"{mode} (LISTEN/NOTIFY)"
        return f"{mode} (polling every {self.idle_interval():g}s)"

    def idle_interval(self) -> float:
        """Seconds to sleep when nothing is due: short while wake-ups do not arrive."""
        if self._listener is None or self._listener.mode is wakeup.WakeupMode.LISTENING:
            return self.poll_interval
        return min(self.poll_interval, float(app_settings.WAKEUP_FALLBACK_POLL_INTERVAL))

    def request_stop(self, *, now: bool = False) -> None:
        """Stop claiming; in-flight attempts get ``SHUTDOWN_GRACE`` seconds (none with
        ``now``). Claims of work not started are released; attempts still running keep
        their claims, unrefreshed, until they go stale (see :meth:`_shutdown`)."""
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
            logger.warning("second %s: stopping now", signal.Signals(signum).name)
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
            self._listener = wakeup.PostgresListener(
                self.using, self._wake, on_mode_change=self._observer.heartbeat
            )
            self._listener.start()
            # The start line says whether wake-ups work; the probe takes milliseconds
            # when they do, PROBE_TIMEOUT when they do not.
            self._listener.decided.wait(wakeup.PROBE_TIMEOUT + 5.0)

    def _worker(self) -> None:
        epoch = self._outage_epoch
        try:
            while True:
                with self._work_available:
                    while not self._queued and not self._workers_exit:
                        self._work_available.wait()
                    if not self._queued:
                        return
                    work = self._queued.popleft()
                    self._running[work.key] = work
                epoch = self._check_connection(epoch)
                with self._lock:
                    self._unmarked[work.key] = work
                self._mark_wanted.set()
                self._observer.attempt_started(work)
                outcome = self._execute(work)
                self._observer.attempt_ended(work, outcome.duration)
                with self._lock:
                    self._running.pop(work.key, None)
                    self._unmarked.pop(work.key, None)
                self._outcomes.put(outcome)
                self._wake.set()
                if outcome.result is not Result.SUCCEEDED:
                    # prepare may have left this thread's connection broken.
                    with contextlib.suppress(Exception):
                        close_old_connections()
        finally:
            connections.close_all()

    @staticmethod
    def _execute(work: ClaimedWork) -> Outcome:
        try:
            return execute(registry.for_work(work), work)
        except BaseException as error:  # noqa: BLE001 - e.g. the kind was unregistered
            return Outcome(work, Result.FAILED, error)

    def _check_connection(self, epoch: int) -> int:
        """Before an attempt: replace this thread's connections that saw errors and, after
        an outage, the runner's database connection if it no longer answers. Costs no
        query unless one of those happened (``close_old_connections`` would also close a
        healthy connection on every attempt when ``CONN_MAX_AGE`` is 0)."""
        outage = epoch != self._outage_epoch
        for connection in connections.all(initialized_only=True):
            if connection.connection is None or connection.in_atomic_block:
                continue
            if connection.errors_occurred or (outage and connection.alias == self.using):
                try:
                    if connection.is_usable():
                        connection.errors_occurred = False
                    else:
                        connection.close()
                except Exception:  # noqa: BLE001 - a broken connection fails to close, too
                    _close_connection(connection.alias)
        return self._outage_epoch

    def _heartbeat_loop(self) -> None:
        """Refreshes heartbeats every ``HEARTBEAT_INTERVAL`` and writes start markers
        shortly after attempts start. Survives any exception: a runner whose heartbeats
        fail for half of ``STALE_AFTER`` stops claiming (see :meth:`_wants_more`)."""
        next_beat = time.monotonic() + self.heartbeat_interval
        failing = False
        try:
            while not self._helpers_stop.is_set():
                self._mark_wanted.wait(max(0.0, next_beat - time.monotonic()))
                if self._helpers_stop.is_set():
                    return
                try:
                    if self._mark_wanted.is_set():
                        with self._lock:
                            delay = flow_starts.mark_delay(self._unmarked.values(), _MARK_STARTED_DELAY)
                        self._helpers_stop.wait(min(delay, self.heartbeat_interval))
                        self._mark_wanted.clear()
                        self._mark_started()
                    if time.monotonic() >= next_beat:
                        next_beat = time.monotonic() + self.heartbeat_interval
                        self._observer.heartbeat()
                        held = self._held()
                        if held:
                            claims.heartbeat(held, using=self.using)
                        self._last_heartbeat = time.monotonic()
                    if failing:
                        failing = False
                        logger.warning("heartbeats work again")
                except Exception as error:  # noqa: BLE001 - nothing may end the heartbeats
                    failing = True
                    logger.warning(
                        "heartbeat failed (%s); retrying in %gs",
                        type(error).__name__,
                        self.heartbeat_interval,
                    )
                    _close_connection(self.using)
                    next_beat = time.monotonic() + self.heartbeat_interval
        finally:
            connections.close_all()

    def _mark_started(self) -> None:
        with self._lock:
            started = list(self._unmarked.values())
        if started:
            claims.mark_started(started, using=self.using)
            with self._lock:
                for work in started:
                    self._unmarked.pop(work.key, None)

    def _heartbeat_failing(self) -> bool:
        # Half of STALE_AFTER, but never less than one and a half heartbeat intervals, so
        # one heartbeat's own duration does not pause claiming at every beat.
        limit = max(self.stale_after.total_seconds() / 2, 1.5 * self.heartbeat_interval)
        return time.monotonic() - self._last_heartbeat > limit

    def _held(self) -> list[ClaimedWork]:
        with self._lock:
            return [
                *self._queued,
                *self._running.values(),
                *(pending.outcome.work for pending in self._unwritten),
                *self._unguarded,
            ]

    def _free_threads(self) -> int:
        """Threads with nothing to run: kinds with flow limits are claimed only this far,
        so a claimed row of theirs never waits in this runner for a thread."""
        with self._lock:
            return self.concurrency - len(self._queued) - len(self._running)

    def _held_count(self) -> int:
        with self._lock:
            return len(self._queued) + len(self._running) + len(self._unwritten) + len(self._unguarded)

    # --- main loop --------------------------------------------------------------------

    def _loop(self) -> None:
        # --once runs what is due when it starts (by the database's clock), so
        # rescheduled work is not retried within the same run.
        cutoff: datetime | None = None
        next_stale_check = 0.0
        next_purge = 0.0
        stale_check_every = min(self.poll_interval, self.stale_after.total_seconds() / 4)
        while not self._stop_requested.is_set():
            self._wake.clear()
            claimed = 0
            more_due = False
            purging = False
            try:
                if self.once and cutoff is None:
                    cutoff = claims.database_now(self.using)
                self._write_outcomes()
                self._guard_unguarded()
                if time.monotonic() >= next_purge:
                    next_purge = time.monotonic() + self.sweep_interval
                    deleted = retention.purge_batch(using=self.using)
                    self.stats.purged += deleted
                    purging = deleted >= app_settings.PURGE_BATCH_SIZE
                    if purging:
                        next_purge = 0.0
                if self._wants_more():
                    check_stale = time.monotonic() >= next_stale_check
                    if check_stale:
                        next_stale_check = time.monotonic() + stale_check_every
                    claimed, more_due = self._claim(cutoff, check_stale=check_stale)
                self._database_back()
                self._backoff = 0.0
            except DATABASE_UNAVAILABLE as error:
                self._database_lost(error)
                self._stop_requested.wait(self._backoff)
                continue
            except Exception as error:  # noqa: BLE001 - only a signal ends the runner
                # Its message may hold patient data (a trigger echoed by a constraint): type only.
                logger.error("runner loop error (%s); carrying on", type(error).__name__)
                self._backoff = min(max(self._backoff * 2, 0.5), _MAX_BACKOFF)
                self._stop_requested.wait(self._backoff)
                continue
            if self.once and not claimed and not purging and self._held_count() == 0:
                return
            # Claim again at once only if the last claim may have left due work behind;
            # otherwise wait, so the workers start the work just claimed right away.
            if purging or (more_due and self._wants_more()):
                continue
            self._wake.wait(self._next_wait())

    def _next_wait(self) -> float:
        """How long the loop may sleep: until the next poll (short while wake-ups do not
        arrive), an outcome's retry, or a rate window that held work back freeing a start."""
        wait = self.idle_interval()
        retry_in = self._claimer.retry_in()
        if retry_in is not None:
            wait = min(wait, max(retry_in, 0.005))
        with self._lock:
            retries = [pending.retry_at for pending in self._unwritten if pending.failures]
        if self._unguarded:
            wait = min(wait, 0.05)
        if retries:
            wait = min(wait, max(0.05, min(retries) - time.monotonic()))
        return wait

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
        if self._heartbeat_failing():
            # Our claims may be going stale: taking more would only hand them out twice.
            if not self._claims_paused:
                self._claims_paused = True
                logger.warning("no heartbeat for over half of STALE_AFTER; not claiming until one succeeds")
            return False
        if self._claims_paused:
            self._claims_paused = False
            logger.warning("heartbeats succeed again; claiming again")
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
        due = self._claimer.claim_due(limit, now=cutoff, startable=self._free_threads()) if limit > 0 else []
        self._observer.claimed(due)
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
            self._observer.claimed(stale)
            with self._lock:
                self._unguarded.extend(stale)
            claimed += self._guard_unguarded()
        return claimed, more

    def _guard_unguarded(self) -> int:
        """Run the crash-loop guard on reclaimed work; dispatch what may run. An item
        whose guard write fails stays held (and heart-beaten) and is tried again on the
        next turn of the loop; it never takes the batch's other claims with it."""
        with self._lock:
            works, self._unguarded = self._unguarded, []
        runnable: list[ClaimedWork] = []
        retry: list[ClaimedWork] = []
        for number, work in enumerate(works):
            try:
                if self._guard_crash_loop(work):
                    runnable.append(work)
            except DATABASE_UNAVAILABLE:
                retry.extend(works[number:])
                with self._lock:
                    self._unguarded.extend(retry)
                self._dispatch(runnable)
                raise
            except Exception as error:  # noqa: BLE001 - contained to this item
                self._log_write_error(work, "reclaim", error)
                retry.append(work)
        with self._lock:
            self._unguarded.extend(retry)
        self._dispatch(runnable)
        return len(runnable)

    def _dispatch(self, works: list[ClaimedWork]) -> None:
        if works:
            with self._work_available:
                self._queued.extend(works)
                self._work_available.notify(len(works))

    def _guard_crash_loop(self, work: ClaimedWork) -> bool:
        """Reclaimed work runs again unless its lost attempts used up the schedule (or
        its claims were lost before starting too often); the lost attempt is in the
        history before the work runs again."""
        workflow = registry.for_work(work)
        if work.attempt < workflow.max_attempts and work.lost_unstarted < UNSTARTED_LOSSES_MAX:
            if not claims.record_lost(work):
                self._log_lost(work)
                return False
            self._log_outcome(work, "reclaimed from a runner that stopped heart-beating", logging.WARNING)
            return True
        if work.attempt >= workflow.max_attempts:
            error = (
                f"WorkerLost: the runner of attempt {work.attempt} stopped heart-beating and "
                f"the retry schedule allows {workflow.max_attempts} attempts"
            )
        else:
            error = (
                f"WorkerLost: {work.lost_unstarted} claims of this work were lost before their "
                f"attempt started; at most {UNSTARTED_LOSSES_MAX} are allowed"
            )
        if claims.abandon(work, error=error, reason="lost too many times"):
            self.stats.abandoned += 1
            self._observer.finished(work, "abandoned")
            self._log_outcome(work, "abandoned (its runners kept dying)", logging.ERROR)
            tasks_running.send_finished([work], succeeded=False)
        else:
            self._log_lost(work)
        return False

    # --- outcomes ---------------------------------------------------------------------

    def _write_outcomes(self) -> None:
        """Write every finished attempt's outcome whose time has come.

        An outage stops the round (raised: the loop waits and reconnects) and keeps what is
        not written. Any other error is contained to its item: logged by kind, id and
        exception type, and tried again later, while the other outcomes are written.
        """
        while True:
            try:
                outcome = self._outcomes.get_nowait()
            except Empty:
                break
            self._observe_runtime(outcome.duration)
            with self._lock:
                self._unwritten.append(_Pending(outcome))
        now = time.monotonic()
        with self._lock:
            due = [pending for pending in self._unwritten if pending.retry_at <= now]
        successes: dict[str, list[_Pending]] = {}
        for pending in due:
            if pending.outcome.result is Result.SUCCEEDED:
                successes.setdefault(pending.outcome.work.claim_token, []).append(pending)
                continue
            self._write_one([pending], self._write_failure)
        # Successes of one claim go in one statement; each batch leaves the list as soon
        # as it is written, so an outage half-way never writes one twice.
        for batch in successes.values():
            self._write_one(batch, self._write_successes)
        self._observer.outcomes_written()

    def _write_one(self, batch: list[_Pending], write: Any) -> None:
        try:
            write(batch)
        except DATABASE_UNAVAILABLE:
            raise
        except Exception as error:  # noqa: BLE001 - contained to this item
            if len(batch) > 1:  # one item's row may be the cause: write each on its own
                for pending in batch:
                    self._write_one([pending], write)
                return
            (pending,) = batch
            pending.failures += 1
            pending.retry_at = time.monotonic() + min(
                _WRITE_RETRY_DELAY * 2 ** (pending.failures - 1), _WRITE_RETRY_MAX_DELAY
            )
            self._log_write_error(pending.outcome.work, "outcome", error)
            return
        done = {id(pending) for pending in batch}
        with self._lock:
            self._unwritten = [pending for pending in self._unwritten if id(pending) not in done]

    def _log_write_error(self, work: ClaimedWork, what: str, error: BaseException) -> None:
        # Kind, id and exception type only: the message may echo patient data.
        logger.error(
            "%s #%s attempt %d: writing its %s failed (%s); it stays held and is tried again",
            work.kind,
            work.id,
            work.attempt,
            what,
            type(error).__name__,
            extra={"workflow_kind": work.kind, "work_id": work.id, "attempt": work.attempt},
        )

    def _write_successes(self, batch: list[_Pending]) -> None:
        written, lost = claims.finish_done(pending.outcome.work for pending in batch)
        self.stats.done += len(written)
        for work in written:
            self._observer.finished(work, "done")
            self._log_outcome(work, "done", logging.INFO)
        tasks_running.send_finished(written, succeeded=True)
        for work in lost:
            self._log_lost(work)

    def _write_failure(self, batch: list[_Pending]) -> None:
        (pending,) = batch
        outcome = pending.outcome
        work = outcome.work
        if outcome.result is Result.CLAIM_LOST:
            self._log_lost(work)
            return
        assert outcome.error is not None
        error_type = type(outcome.error).__name__
        error = describe_error(outcome.error)
        if pending.failures >= _PLAIN_ERROR_AFTER:
            error = f"{error_type}: (the message could not be stored)"
        workflow = registry.for_work(work)
        permanent = is_permanent(outcome.error)
        if not permanent and self._released_for_outage(work, outcome.error):
            if claims.release_after_outage(work, delay=_OUTAGE_RETRY_DELAY, error=error):
                self.stats.released += 1
                self._observer.finished(work, "released")
                self._log_outcome(
                    work,
                    f"failed ({error_type}: database unavailable); released, attempt unchanged",
                    logging.WARNING,
                )
            else:
                self._log_lost(work)
            return
        delay = None if permanent else workflow.delay_after(work.attempt)
        if delay is None:
            reason = "permanent error" if permanent else "retry schedule exhausted"
            if claims.abandon(work, error=error, reason=reason):
                self.stats.abandoned += 1
                self._observer.finished(work, "abandoned")
                self._log_outcome(work, f"failed ({error_type}); abandoned: {reason}", logging.ERROR)
                tasks_running.send_finished([work], succeeded=False)
            else:
                self._log_lost(work)
        elif claims.reschedule(work, delay=delay, error=error):
            self.stats.rescheduled += 1
            self._observer.finished(work, "rescheduled")
            self._log_outcome(
                work,
                f"failed ({error_type}); {describe_attempt(work.kind, work.attempt + 1)} "
                f"in {delay.total_seconds():g}s",
                logging.WARNING,
            )
        else:
            self._log_lost(work)

    @staticmethod
    def _released_for_outage(work: ClaimedWork, error: BaseException) -> bool:
        """Whether a failure only says the database was unreachable, and this attempt
        has not been released for that too often already (a workflow that always fails
        so must still walk its schedule and end)."""
        if not _is_database_unavailable(error):
            return False
        releases = sum(
            1
            for entry in work.history
            if isinstance(entry, dict)
            and entry.get("outcome") == "released"
            and entry.get("reason") == "database unavailable"
            and entry.get("attempt") == work.attempt
        )
        return releases < OUTAGE_RELEASES_MAX

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
            "%s #%s %s: %s",
            work.kind,
            work.id,
            describe_attempt(work.kind, work.attempt),
            outcome,
            extra={
                "workflow_kind": work.kind,
                "work_id": work.id,
                "attempt": attempt_number(work.kind, work.attempt),
                "outcome": outcome,
            },
        )

    def _log_lost(self, work: ClaimedWork) -> None:
        self.stats.lost += 1
        self._observer.finished(work, "lost")
        self._log_outcome(
            work, "claim lost; result discarded (another runner or an operator took over)", logging.WARNING
        )

    # --- database outages -------------------------------------------------------------

    def _database_lost(self, error: BaseException) -> None:
        _close_connection(self.using)
        if self._outage_started is None:
            self._outage_epoch += 1
            self._outage_started = time.monotonic()
            self._observer.database_lost()
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
        """Stop claiming, release work not started, give running attempts the grace.

        Never two executions of one item at once: an attempt still running when the
        grace ends keeps its claim. Its heartbeats stop with this runner, so another
        runner reclaims it after ``STALE_AFTER`` (counted as a lost attempt) — by then
        this process has exited and the attempt with it. Releasing it instead would let
        another runner start the item while this one still runs it.
        """
        with self._work_available:
            unstarted = [*self._queued, *self._unguarded]
            self._queued.clear()
            self._unguarded = []
            self._workers_exit = True
            self._work_available.notify_all()
        deadline = time.monotonic() + (0.0 if self._stop_now.is_set() else self.shutdown_grace)
        self._release(unstarted, deadline)
        while self._running_count() and time.monotonic() < deadline and not self._stop_now.is_set():
            self._wake.wait(0.05)
            self._wake.clear()
            self._try_write_outcomes()
        # Outcomes that arrived in time are written (outcomes of finished attempts only:
        # a write that keeps failing is left to go stale, like a running attempt).
        flush_deadline = max(deadline, time.monotonic() + min(self.shutdown_grace, 5.0))
        while not self._try_write_outcomes() and time.monotonic() < flush_deadline:
            self._helpers_stop.wait(0.2)  # events only: libfaketime breaks time.sleep
        with self._lock:
            still_running = len(self._running)
            unwritten = len(self._unwritten)
        if still_running or unwritten:
            logger.warning(
                "exiting with %d attempt(s) still running and %d outcome(s) unwritten: their "
                "claims are kept and no longer refreshed, so other runners take them over "
                "after STALE_AFTER (%gs), never while they may still run here",
                still_running,
                unwritten,
                self.stale_after.total_seconds(),
            )
        self._helpers_stop.set()
        self._mark_wanted.set()
        wakeup.remove_local_waiter(self._wake)
        if self._listener is not None:
            self._listener.stop()
        self._observer.stop()
        _close_connection(self.using)

    def _running_count(self) -> int:
        with self._lock:
            return len(self._running)

    def _try_write_outcomes(self) -> bool:
        """Write what can be written; whether nothing is left to write."""
        try:
            self._write_outcomes()
        except DATABASE_UNAVAILABLE as error:
            self._database_lost(error)
            return False
        except Exception as error:  # noqa: BLE001 - shutting down must not fail
            logger.error("writing outcomes at shutdown failed (%s)", type(error).__name__)
            return False
        with self._lock:
            return not self._unwritten

    def _release(self, works: Iterable[ClaimedWork], deadline: float) -> None:
        works = list(works)
        if not works:
            return
        while True:
            try:
                released = claims.release(works)
            except Exception as error:  # noqa: BLE001 - unreleased claims go stale, no worse
                if not _is_database_unavailable(error):
                    logger.error("releasing claims failed (%s)", type(error).__name__)
                    return
                self._database_lost(error)
                if time.monotonic() >= deadline:
                    logger.error(
                        "could not release %d claim(s) before exiting; they will be reclaimed "
                        "after STALE_AFTER",
                        len(works),
                    )
                    return
                self._helpers_stop.wait(0.2)  # events only: libfaketime breaks time.sleep
                continue
            self.stats.released += released
            self._observer.released(works)
            if released:
                with contextlib.suppress(Exception):
                    wakeup.notify(self.using)  # another runner can start them at once
            logger.info(
                "released %d claim(s) at shutdown: pending again, due now, attempt unchanged",
                released,
            )
            return

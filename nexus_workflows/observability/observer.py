"""The runner's observer: the one object the runner tells what happens.

The runner calls it at a few points; it keeps the runner's row in the ``Runner`` table,
adds the per-minute outcome counts once per batch of outcomes, feeds the Prometheus
metrics (when ``--metrics-port`` is given) and sends the signals. Nothing it does may stop the
runner: the only database errors it lets through are the counts' upsert's, retried like the outcome
writes they follow (at shutdown until the grace ends; beyond it, a WARNING says how many are lost).

The runner's row is refreshed after the claims' heartbeat, and its statements wait at
most a second for a lock (:func:`row_lock_wait`): a statement on the row that waits (a
lock held on it, a migration queued on the table) must not hold back the heartbeats of
the claims, or another runner would reclaim attempts that are still running. (A thread
of its own would have cost a connection beyond ``DB_CONNECTIONS``.)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from django.db import Error as DatabaseError  # InterfaceError included
from django.db import connections

from nexus_workflows import signals, sql
from nexus_workflows.conf import app_settings
from nexus_workflows.database_errors import is_database_unavailable, rerun_if_ended_idle, statement_refused
from nexus_workflows.deferred.attempts import attempt_number
from nexus_workflows.observability import counts, runners
from nexus_workflows.observability.clock import database_now
from nexus_workflows.observability.figures import task_paths
from nexus_workflows.observability.runner_metrics import RunnerMetrics

logger = logging.getLogger("nexus_workflows.deferred.runner")

FAILED = ("rescheduled", "abandoned")

# Seconds between two upserts of the outcome counts: a minute's bars never miss more than
# this, and a drain of thousands of items a second pays for one upsert a second.
COUNTS_EVERY = 1.0


class Observer:
    def __init__(
        self,
        *,
        kinds: Sequence[str],
        concurrency: int,
        using: str,
        in_flight: Callable[[], int],
        wakeup_mode: Callable[[], str] = lambda: "poll",
        metrics_host: str = "127.0.0.1",
        metrics_port: int | None = None,
        queues: Sequence[str] | None = (),
    ) -> None:
        self.kinds = list(kinds)
        self.queues = queues  # of Django tasks: None for every queue
        self.concurrency = concurrency
        self.using = using
        self.in_flight = in_flight
        self.wakeup_mode = wakeup_mode
        self.metrics_host = metrics_host
        self.metrics_port = metrics_port
        self.metrics: RunnerMetrics | None = None
        self.runner_id: int | None = None
        self.done = 0
        self.failed = 0
        self._unwritten_counts: Counter[tuple[str, str]] = Counter()
        self._sealed: tuple[str, dict[tuple[str, str], int]] | None = None
        self._counts_written_at = 0.0
        # (id, claim token) -> perf_counter at start, while prepare runs; then -> duration.
        self._started: dict[tuple[int, str], float] = {}
        self._durations: dict[tuple[int, str], float] = {}
        self._next_sweep = 0.0
        # The heartbeat thread must not write the row again once stop() removed it.
        self._row_lock = threading.Lock()
        self._stopped = False
        # Failed writes of the runner's row in a row (see _register_failed).
        self._register_failures = 0

    # --- lifecycle (main thread) -----------------------------------------------------------

    def start(self) -> str:
        """Open the metrics endpoint and write the runner's row; returns a description of
        the endpoint for the start line (empty without one)."""
        endpoint = ""
        if self.metrics_port is not None:
            self.metrics = RunnerMetrics(
                kinds=[*self.kinds, *self._task_paths()], using=self.using, in_flight=self.in_flight
            )
            port = self.metrics.serve(self.metrics_host, self.metrics_port)
            host = f"[{self.metrics_host}]" if ":" in self.metrics_host else self.metrics_host
            endpoint = f"http://{host}:{port}/metrics"
        try:
            self._register()
        except BaseException:
            self._stop_metrics()  # not left listening for a runner that did not start
            raise
        return endpoint

    def _task_paths(self) -> list[str]:
        """The Django task paths with rows this runner may claim, for their series to start
        at 0; none when the database does not answer (they start at 0 when first claimed)."""
        try:
            return task_paths(self.using, self.queues)
        except DatabaseError as error:
            logger.warning(
                "metrics: the Django task paths with rows were not read (%s); their series start "
                "when first claimed",
                type(error).__name__,
            )
            _close(self.using)
            return []

    def stop(self) -> None:
        failed = "refused"  # a lock wait cut short, SQLite busy: outcomes_written keeps them
        try:
            self.outcomes_written(force=True)  # the last counts (released attempts included)
            self.outcomes_written(force=True)  # and any that came while a sealed batch went again
        except DatabaseError as error:
            failed = type(error).__name__
        if self.counts_unwritten:  # the runner's shutdown retried them through its grace
            missing = f"({failed}): the dashboard misses up to {self.counts_unwritten} outcome(s)"
            logger.warning("could not write the last outcome counts %s", missing)
        with self._row_lock:
            self._stopped = True
            if self.runner_id is not None:
                try:
                    runners.remove(self.runner_id, using=self.using, lock_wait=row_lock_wait())
                except DatabaseError as error:
                    logger.warning(
                        "could not remove this runner's row (%s); it will show as dead",
                        type(error).__name__,
                    )
        self._stop_metrics()

    def _stop_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.stop()

    def _register(self) -> None:
        try:
            pk = self._insert_row()
        except DatabaseError as error:
            # The heartbeat tries again; the runner itself need not wait for it.
            self._register_failed(type(error).__name__)
            _close_if_gone(self.using, error)
        else:
            self._register_written(pk)  # in autocommit: the insert has committed

    def _insert_row(self) -> int:
        """Insert this runner's row (a new one); its id. Raises the database's errors. It
        is written only once its transaction commits (:meth:`_register_written`)."""
        return runners.register(
            kinds=self.kinds,
            concurrency=self.concurrency,
            wakeup_mode=str(self.wakeup_mode()),
            using=self.using,
        )

    def _register_failed(self, what: str) -> None:
        """Said once (WARNING) per spell of failed writes, then at DEBUG while it lasts:
        the heartbeat tries every interval (SQLite busy for minutes was a WARNING each)."""
        self._register_failures += 1
        if self._register_failures == 1:
            logger.warning("could not write this runner's row (%s); retrying", what)
        else:
            logger.debug("could not write this runner's row again (%s)", what)

    def _register_written(self, pk: int) -> None:
        """The row's insert has committed: only now is it this runner's row, and said so."""
        self.runner_id = pk
        if self._register_failures:
            logger.debug("this runner's row written after %d failed tries", self._register_failures)
            self._register_failures = 0

    # --- attempts ------------------------------------------------------------------------

    def claimed(self, works: Sequence[Any], *, reclaimed: bool = False) -> None:
        if self.metrics is not None and works:
            for work in works:
                self.metrics.start_at_zero(work.kind)  # before its attempt can end
                if reclaimed and work.lost_started:  # a claim lost unstarted was no attempt
                    self.metrics.reclaimed(work.kind)
            self.metrics.claims.inc(len(works))

    def attempt_started(self, work: Any) -> None:
        """Worker thread, just before ``prepare``."""
        self._started[(work.id, work.claim_token)] = time.perf_counter()
        if signals.attempt_started.receivers:  # build nothing for nobody
            signals.send(
                signals.attempt_started,
                kind=work.kind,
                id=work.id,
                attempt=attempt_number(work.kind, work.attempt, work.backend_name),
                in_runner=True,
            )

    def attempt_ended(self, work: Any, duration: float) -> None:
        """Worker thread, when ``prepare`` returned or raised."""
        key = (work.id, work.claim_token)
        self._started.pop(key, None)
        self._durations[key] = duration
        if self.metrics is not None:
            self.metrics.observe_duration(work.kind, duration)

    def finished(self, work: Any, outcome: str) -> None:
        """Main thread: the attempt's outcome was written (or found lost)."""
        duration = self._durations.pop((work.id, work.claim_token), None)
        self._count(work.kind, outcome)
        if not (signals.attempt_finished.receivers or signals.work_abandoned.receivers):
            return  # the drain's hot path: nothing to build
        number = attempt_number(work.kind, work.attempt, work.backend_name)
        if duration is not None:  # work abandoned by the crash-loop guard did not run here
            signals.send(
                signals.attempt_finished,
                kind=work.kind,
                id=work.id,
                attempt=number,
                outcome=outcome,
                duration=duration,
                in_runner=True,
            )
        if outcome == "abandoned":
            signals.send(signals.work_abandoned, kind=work.kind, id=work.id, attempt=number, in_runner=True)

    def released(self, works: Iterable[Any]) -> None:
        """Main thread, at shutdown: claims given back; those that were running end here."""
        now = time.perf_counter()
        for work in works:
            started = self._started.pop((work.id, work.claim_token), None)
            if started is None:
                continue  # claimed but never started: not an attempt
            self._durations[(work.id, work.claim_token)] = now - started
            self.finished(work, "released")

    def _count(self, kind: str, outcome: str) -> None:
        self._unwritten_counts[(kind, outcome)] += 1
        if outcome == "done":
            self.done += 1
        elif outcome in FAILED:
            self.failed += 1
        if self.metrics is not None:
            self.metrics.attempt_ended(kind, outcome)

    def outcomes_written(self, *, force: bool = False) -> None:
        """Main thread, after a batch of outcomes: one upsert of the counts, at most every
        ``COUNTS_EVERY`` seconds (a busy drain writes a batch every few milliseconds). Raises
        an outage's errors (the runner waits and retries with its next batch)."""
        if self._sealed is None:
            if not self._unwritten_counts:
                return
            if not force and time.monotonic() - self._counts_written_at < COUNTS_EVERY:
                return
            # Sealed with a token: a retry sends exactly this batch again, under the same token.
            self._sealed = (uuid.uuid4().hex, dict(self._unwritten_counts))
            self._unwritten_counts.clear()
        token, batch = self._sealed
        try:
            counts.add(batch, token=token, using=self.using)
        except DatabaseError as error:
            if is_database_unavailable(error):
                raise  # an outage (read-only too): the runner waits, then this batch goes again
            if statement_refused(error) is not None:
                # A lock wait cut short (another runner's counts of the same minute) or a
                # cancel: the same batch, under the same token, goes with the next one.
                logger.debug("outcome counts not written yet (%s)", statement_refused(error))
                return
            # Anything else (the table missing before `migrate`, say) must not stop the
            # runner: these counts are dropped, the work itself was written.
            logger.error("outcome counts not written (%s); dropped", type(error).__name__)
        self._sealed = None
        self._counts_written_at = time.monotonic()

    @property
    def counts_unwritten(self) -> int:
        """Outcomes counted and not written yet (a sealed batch, and any since); 0: none."""
        return sum(self._sealed[1].values() if self._sealed else ()) + self._unwritten_counts.total()

    # --- the database ----------------------------------------------------------------------

    def database_lost(self) -> None:
        if self.metrics is not None:
            self.metrics.outages.inc()

    def heartbeat(self) -> None:
        """Heartbeat thread (after the claims' beat) and wake-up listener: refresh the
        runner's row; now and then purge old rows. Each statement waits at most
        :func:`row_lock_wait` for a lock: a lock held on the row (an operator's open
        transaction, a migration queued on the table) must not hold these threads back,
        or the claims would go stale and another runner reclaim attempts still running.

        A failed statement leaves its block (on PostgreSQL its transaction, rolled back)
        before anything else is done about it: nothing runs on in an aborted or closed
        transaction. The row and the sweep go in blocks of their own, so a failed sweep
        never takes back a row just written."""
        with self._row_lock:
            if self._stopped:
                return
            if not self._refresh_row():
                return
            if time.monotonic() >= self._next_sweep:
                self._next_sweep = time.monotonic() + float(app_settings.SWEEP_INTERVAL)
                self._bounded(self._sweep, "old runner rows and counts not purged")

    def show_mode(self) -> None:
        """Wake-up listener, on a mode change: refresh the runner's row only (the sweep is
        the heartbeat thread's: this runs on a journal writer, whose saves would wait)."""
        with self._row_lock:
            if not self._stopped:
                self._refresh_row()

    def _refresh_row(self) -> bool:
        """Refresh the row, or write it again, in a block of its own; whether it passed. A
        row written again is this runner's only once the block has committed: on PostgreSQL
        the commit itself may fail (a deferred constraint trigger, a serialization failure)."""
        inserted: list[int] = []
        error = self._bounded(functools.partial(self._write_row, inserted), "runner row not refreshed")
        if error is None:
            if inserted:
                self._register_written(inserted[0])
            return True
        if inserted:  # its insert passed, and then its transaction did not
            self._register_failed(type(error).__name__)
        return False

    def _bounded(self, write: Callable[[], None], failed: str) -> DatabaseError | None:
        """Run ``write`` with its lock waits bounded; the error if it failed. A failure is
        said at DEBUG; the connection is closed only when the error says the session is gone
        (an outage): after a refusal or a rolled-back error it is fine, and a new one per
        heartbeat would cost a login every interval for as long as the fault lasts. A session
        the server ended for sitting idle between beats is no failure: again on a new one."""
        try:
            # A @contextmanager is a decorator too, entered anew at each call (a rerun's).
            rerun_if_ended_idle(self.using, _waiting_at_most(self.using, row_lock_wait())(write))
        except DatabaseError as error:  # a lock waited for too long, a refusal, or an outage
            logger.debug("%s (%s)", failed, type(error).__name__)
            _close_if_gone(self.using, error)
            return error
        return None

    def _write_row(self, inserted: list[int]) -> None:
        """Refresh this runner's row, or insert it again when it is missing (never written,
        or purged while the runner was away: its new id goes in ``inserted``); raises the
        database's errors."""
        if self.runner_id is not None and runners.refresh(
            self.runner_id,
            in_flight=self.in_flight(),
            done=self.done,
            failed=self.failed,
            wakeup_mode=str(self.wakeup_mode()),
            using=self.using,
        ):
            return
        try:
            inserted.append(self._insert_row())
        except DatabaseError as error:
            self._register_failed(type(error).__name__)
            raise  # out of the block first: heartbeat() closes the connection if need be

    def _sweep(self) -> None:
        now = database_now(self.using)
        runners.purge_dead(now, using=self.using)
        counts.purge(now, using=self.using)


def row_lock_wait() -> float:
    """How long the runner's row statements wait for a lock: 1 s, or HEARTBEAT_INTERVAL if shorter."""
    return min(1.0, float(app_settings.HEARTBEAT_INTERVAL))


@contextlib.contextmanager
def _waiting_at_most(using: str, seconds: float) -> Iterator[None]:
    """Statements in the block wait at most ``seconds`` for a row lock, then raise (a refusal,
    :func:`~nexus_workflows.database_errors.statement_refused`): PostgreSQL's local ``lock_timeout``
    in one transaction, MariaDB's session ``innodb_lock_wait_timeout`` lowered around the block,
    in whole seconds (``lock_waits_at_most``); as it is elsewhere (SQLite has no row locks)."""
    with sql.for_connection(using).lock_waits_at_most(using, seconds):
        yield


def _close(using: str) -> None:
    with contextlib.suppress(Exception):
        connections[using].close()


def _close_if_gone(using: str, error: BaseException) -> None:
    """Close the connection when ``error`` says its session is gone or unusable (an
    outage, read-only): the next statement opens a new one. Only ever called outside the
    block that ran the statement, so no transaction is left open on it."""
    if is_database_unavailable(error):
        _close(using)

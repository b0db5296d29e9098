"""The runner: its main loop claims due (and stale) work and dispatches it; the parts
(pool, heartbeat, outcome writer, back-off, shutdown) live in their own modules."""

# Long module: the Runner: its loop, and where its parts are wired together.

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.db import connections, router

from nexus_workflows import __version__
from nexus_workflows.clock import database_now
from nexus_workflows.conf import app_settings
from nexus_workflows.database_errors import statement_refused
from nexus_workflows.deferred import wakeup
from nexus_workflows.deferred.claims import Claimer, ClaimInterrupted
from nexus_workflows.deferred.execution import Outcome
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.runner import dead_connections
from nexus_workflows.deferred.runner.async_pool import AsyncPool
from nexus_workflows.deferred.runner.backoff import Backoff
from nexus_workflows.deferred.runner.capacity import Capacity
from nexus_workflows.deferred.runner.heartbeat import Heartbeat, heartbeat_failing
from nexus_workflows.deferred.runner.journal import JournalWriter
from nexus_workflows.deferred.runner.lanes import LaneClaims, journal_writers, lane_of
from nexus_workflows.deferred.runner.ledger import ASYNC, SYNC, Ledger
from nexus_workflows.deferred.runner.logs import log_outcome
from nexus_workflows.deferred.runner.outcomes import OutcomeWriter
from nexus_workflows.deferred.runner.pool import SyncPool
from nexus_workflows.deferred.runner.purging import Purging
from nexus_workflows.deferred.runner.reclaim import guard_unguarded
from nexus_workflows.deferred.runner.schedule import LoopSchedule
from nexus_workflows.deferred.runner.selection import selection, worker_id
from nexus_workflows.deferred.runner.shutdown import Shutdown, release_claims
from nexus_workflows.deferred.runner.stats import RunStats, Tally
from nexus_workflows.deferred.runner.stop_signals import StopSignals
from nexus_workflows.deferred.runner.unanswered import UnansweredClaims
from nexus_workflows.deferred.runner.unavailable import (
    close_connection,
    close_if_past_max_age,
    describe_unavailable,
    is_database_unavailable,
    rerun_if_ended_idle,
    session_ended_idle,
)
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.exceptions import UnknownWorkflow
from nexus_workflows.models import DeferredWork
from nexus_workflows.observability.logs import start_line
from nexus_workflows.observability.observer import Observer
from nexus_workflows.redaction import describe

logger = logging.getLogger("nexus_workflows.deferred.runner")

# Seconds the loop waits for a worker to take what a wake-up claimed (a free worker takes
# it within a millisecond; this only bounds the wait if none is free after all).
HAND_OFF_WAIT = 0.01
# Seconds the loop pauses after a turn whose statement the database refused (a deadlock
# or a cancel by hand comes back at once; a lock wait cut short has waited already).
REFUSED_PAUSE = 0.05


class Runner:
    """Runs deferred work until stopped (or, with ``once``, until nothing is due)."""

    def __init__(
        self,
        *,
        kinds: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        async_concurrency: int | None = None,
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
                    f"no deferred workflow is registered for a kind given ({describe(kind)}); "
                    f"deferred kinds: {', '.join(deferred) or 'none'}"
                )
        self.kinds, self.queues = selection(kinds, queues, deferred)
        self.concurrency = concurrency or app_settings.CONCURRENCY
        self.async_concurrency = async_concurrency or app_settings.ASYNC_CONCURRENCY
        self.poll_interval = poll_interval or app_settings.POLL_INTERVAL
        self.once = once
        self.using = using or router.db_for_write(DeferredWork)
        self.install_signal_handlers = install_signal_handlers
        self.stale_after = timedelta(seconds=app_settings.STALE_AFTER)
        self.sweep_interval = float(app_settings.SWEEP_INTERVAL)
        self.shutdown_grace = float(app_settings.SHUTDOWN_GRACE)
        self.stats = RunStats()
        self.worker_id = worker_id()
        self._wake = threading.Event()
        self._stop_requested = threading.Event()
        self._stop_now = threading.Event()
        self._listener: wakeup.PostgresListener | None = None
        self._claims_paused = False
        # Whether the last turn held nothing when it claimed (see _turn).
        self._held_nothing = False
        # Turns in a row whose claim the database refused (see _claim_refused).
        self._refusals = 0
        # A run of purge batches goes on (the last turn purged and wants more), when the
        # last full claim was made (monotonic), whether it left due work behind, and
        # whether the loop was woken (an attempt ended) since the last turn: see _claim_turn.
        self._purge_run = False
        self._claimed_at = 0.0
        self._more_due = False
        self._woken = False
        # Attempts still running when the runner stopped (after the grace); see run().
        self.left_running = 0
        self._build_parts(metrics_host, metrics_port)

    def _build_parts(self, metrics_host: str, metrics_port: int | None) -> None:
        """The runner's parts, each in its module, wired to each other."""
        # Claims an outage cut off after the database ran them: given back once it answers.
        self._unanswered = UnansweredClaims(self.using)
        # Stale work of any kind is reclaimed by one claimer; due work by one per lane.
        self._claimer = Claimer(
            kinds=self.kinds,
            queues=self.queues,
            using=self.using,
            worker_id=self.worker_id,
            on_unanswered=self._unanswered.add,
        )
        self._ledger = self._new_ledger()
        batch_size = int(app_settings.BATCH_SIZE)
        self._capacity = {
            SYNC: Capacity(self.concurrency, batch_size),
            ASYNC: Capacity(self.async_concurrency, batch_size),
        }
        self._lanes = LaneClaims(
            kinds=self.kinds,
            queues=self.queues,
            using=self.using,
            worker_id=self.worker_id,
            ledger=self._ledger,
            capacity=self._capacity,
            claimed=self._claimed,
            reclaimed=self._reclaimed,
            on_unanswered=self._unanswered.add,
        )
        self._journal = JournalWriter(self.using, journal_writers(self.using))
        self._backoff = Backoff(self.poll_interval)
        # Runner row, outcome counts, metrics and signals: see nexus_workflows.observability.
        self._observer = Observer(
            kinds=self.kinds,
            concurrency=self.concurrency,
            using=self.using,
            in_flight=self._ledger.running_count,
            wakeup_mode=lambda: self.wakeup_mode,
            metrics_host=metrics_host,
            metrics_port=metrics_port,
            queues=self.queues,
        )
        self._tally = Tally(self.stats, self._observer)
        self._purging = Purging(self.using, self.stats)
        self._writer = OutcomeWriter(self._ledger, self._tally, self._observe_runtime)
        self._heartbeat = Heartbeat(
            self._ledger,
            using=self.using,
            interval=float(app_settings.HEARTBEAT_INTERVAL),
            stale_after=self.stale_after.total_seconds(),
            on_beat=self._on_beat,
        )
        self._build_pools()

    def _new_ledger(self) -> Ledger:
        # Queued work whose claim went unconfirmed as long as claiming pauses for is
        # not started: another runner may be running it (Ledger, "forfeited").
        at_risk = functools.partial(
            heartbeat_failing,
            stale_after=self.stale_after.total_seconds(),
            interval=float(app_settings.HEARTBEAT_INTERVAL),
        )
        return Ledger(lane_of, at_risk=at_risk)

    def _build_pools(self) -> None:
        self._pool = SyncPool(
            self._ledger,
            self.concurrency,
            using=self.using,
            started=self._attempt_started,
            finished=self._attempt_finished,
            outage_epoch=lambda: self._backoff.epoch,
            save_patch=self._journal.save,
        )
        self._async_pool = AsyncPool(
            self._ledger,
            self.async_concurrency,
            using=self.using,
            started=self._attempt_started,
            finished=self._attempt_finished,
            outage_epoch=lambda: self._backoff.epoch,
            save_patch=self._journal.save_async,
            run_db=self._journal.call_async,
        )

    # --- public -----------------------------------------------------------------------

    def run(self) -> RunStats:
        """Run until stopped; returns the counts of what happened.

        Attempts still running when it returns (``left_running``) hold claims no longer
        heart-beaten: the process must end soon, before ``STALE_AFTER`` lets another
        runner start them too (``runworkflows`` ends it at once: :func:`.shutdown.end_process`).
        """
        signals = StopSignals(self.request_stop, self._stop_requested.is_set, self.shutdown_grace)
        # Start-up is undone if it fails half-way (a log file that cannot be opened, a
        # thread that cannot start): every part started is stopped, the last first, and
        # the error goes up. Once the loop runs, the shutdown stops them in its own order.
        with contextlib.ExitStack() as started:
            started.callback(close_connection, self.using)
            metrics = self._observer.start()  # first: a metrics port in use fails here, cleanly
            started.callback(self._observer.stop)
            if self.install_signal_handlers:
                signals.install()
                started.callback(signals.restore)
            self._start_helpers(started)
            self._log_start(metrics)
            started.pop_all()
        try:
            self._loop()
        finally:
            try:
                self._shutdown()
            finally:
                signals.restore()
        logger.info("runner stopped: %s", self.stats.summary())
        return self.stats

    def _log_start(self, metrics: str) -> None:
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
                dead_connections=self._describe_dead_connections(),
            ),
        )

    def _describe_dead_connections(self) -> str:
        """How its connections notice a silent network (PostgreSQL: libpq's TCP options)."""
        connection = connections[self.using]
        if connection.vendor != "postgresql":
            return ""
        options = connection.settings_dict.get("OPTIONS") or {}
        return dead_connections.describe(options, self.stale_after.total_seconds())

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
        """Seconds to sleep when nothing is due: short while wake-ups do not arrive, or
        until the listener holds the lock that makes enqueues send them."""
        if self._listener is None or self._listener.ready_to_wait():
            return self.poll_interval
        return min(self.poll_interval, float(app_settings.WAKEUP_FALLBACK_POLL_INTERVAL))

    def request_stop(self, *, now: bool = False) -> None:
        """Stop claiming; in-flight attempts get ``SHUTDOWN_GRACE`` seconds (none with
        ``now``). Claims of work not started are released; attempts still running keep
        their claims, unrefreshed, until they go stale (see :class:`.shutdown.Shutdown`)."""
        self._ledger.hold()  # before the main loop notices: nothing queued starts from now on
        self._stop_requested.set()
        if now:
            self._stop_now.set()
        self._wake.set()

    # --- helpers ----------------------------------------------------------------------

    def _start_helpers(self, started: contextlib.ExitStack) -> None:
        """Start the helper threads; each one's stop goes on ``started`` as it starts."""
        self._journal.start()
        started.callback(self._journal.stop)
        # The workers end once the ledger closes (the async loop also once it is told).
        started.callback(self._ledger.close)
        if SYNC in self._lanes.claimers:
            self._pool.start()
        if ASYNC in self._lanes.claimers:
            self._async_pool.start()
            started.callback(self._async_pool.stop)
        self._heartbeat.start()
        started.callback(self._heartbeat.stop)
        wakeup.add_local_waiter(self._wake)
        started.callback(wakeup.remove_local_waiter, self._wake)
        if not self.once and app_settings.WAKEUP and connections[self.using].vendor == "postgresql":
            self._listener = wakeup.PostgresListener(
                self.using,
                self._wake,
                on_mode_change=self._observer.show_mode,
                on_new_work=self._lanes.new_work,
                on_kind_ended=self._lanes.kind_ended,
                on_any_work=self._lanes.wake_limited if self._lanes.limited else None,
                on_rest_held=self._lanes.wake_limited if self._lanes.limited else None,
                run_db=self._journal.call,
            )
            self._listener.start()
            started.callback(self._listener.stop)
            # The start line says whether wake-ups work; the probe takes milliseconds
            # when they do, PROBE_TIMEOUT when they do not.
            self._listener.decided.wait(wakeup.PROBE_TIMEOUT + 5.0)

    def _on_beat(self) -> None:
        """Heartbeat thread, after the claims' beat: the runner's row, and whether the
        async attempts' loop still runs."""
        self._observer.heartbeat()
        # At least a second: a shorter stall is a busy machine, not a blocking prepare.
        self._async_pool.watch(late_after=max(1.0, float(app_settings.HEARTBEAT_INTERVAL)))

    def _attempt_started(self, work: ClaimedWork) -> None:
        """Worker thread or event loop, as ``prepare`` is called: claimed work may instead
        be given up (forfeited) or released unstarted, and logs no start then."""
        log_outcome(work, "started", logging.INFO)
        self._heartbeat.started()
        self._observer.attempt_started(work)

    def _claimed(self, works: list[ClaimedWork]) -> None:
        """Due work was claimed: count it, hand it to its lane."""
        self._observer.claimed(works)
        self._dispatch(works)

    def _observe_runtime(self, outcome: Outcome) -> None:
        self._capacity[lane_of(outcome.work)].observe(outcome.duration)

    def _dispatch(self, works: list[ClaimedWork]) -> None:
        """Hand claimed work to its lane: sync workers wake on the ledger, the loop on a call."""
        if ASYNC in self._ledger.dispatch(works):
            self._async_pool.wake()

    def _attempt_finished(self, outcome: Outcome) -> None:
        """Worker thread or event loop, as ``prepare`` ended: the outcome is held (and
        heart-beaten) until the main loop writes it."""
        self._observer.attempt_ended(outcome.work, outcome.duration)  # before it can be written
        self._ledger.finished(outcome.work, outcome)
        self._writer.put(outcome)
        if outcome.work.limited:
            # Its slot or key is free once the outcome is written, before the next claim.
            self._lanes.wake_limited(outcome.work.kind)
        # Set already, the loop has yet to clear it: its next turn writes this outcome.
        if not self._wake.is_set():
            self._wake.set()

    # --- main loop --------------------------------------------------------------------

    def _loop(self) -> None:
        # --once runs what is due when it starts (by the database's clock), so
        # rescheduled work is not retried within the same run.
        cutoff: datetime | None = None
        schedule = LoopSchedule(
            min(self.poll_interval, self.stale_after.total_seconds() / 4), self.sweep_interval
        )
        while not self._stop_requested.is_set():
            self._woken = self._wake.is_set()
            self._wake.clear()
            try:
                close_if_past_max_age(self.using)  # between turns, as Django between requests
                if self.once and cutoff is None:
                    cutoff = database_now(self.using)
                claimed, more_due, purging = self._turn(cutoff, schedule)
                self._database_back()
            except Exception as error:  # noqa: BLE001 - only a signal ends the runner
                self._loop_failed(error)
                self._stop_requested.wait(self._backoff.delay)
                continue
            if self.once and self._held_nothing and not claimed and not purging and self._once_done():
                return
            if self._listener is not None:
                # With a backlog it claims again by itself: enqueues may skip their NOTIFY.
                self._listener.wait_for_notifies(not self._lanes.backlogged())
                if self._lanes.limited:  # enqueues (ends) of the kinds it rests notify it
                    self._listener.rest_on(self._lanes.quiet_kinds(), self._lanes.full_kinds())
            # Claim again at once only if the last claim may have left due work behind;
            # otherwise wait, so the workers start the work just claimed right away.
            if purging or (more_due and self._wants_more()):
                continue
            self._wake.wait(self._next_wait())

    def _once_done(self) -> bool:
        """--once, after a turn that held nothing and claimed nothing: done unless an
        attempt started since, or rate windows held due work back (it waits for them)."""
        return self._ledger.held_count() == 0 and not self._lanes.held_back()

    def _loop_failed(self, error: Exception) -> None:
        """A loop turn raised: an outage (down, or read-only) is waited out on a new
        connection; anything else is logged by type and the turn is tried again later."""
        refused = statement_refused(error)
        if refused is not None:
            self._claim_refused(refused)
            return
        if is_database_unavailable(error):
            self._connection_failed(error)
            return
        # Its message may hold patient data (a trigger echoed by a constraint): type only.
        logger.error("runner loop error (%s); carrying on", type(error).__name__)
        self._backoff.loop_error()

    def _turn(self, cutoff: datetime | None, schedule: LoopSchedule) -> tuple[int, bool, bool]:
        """One turn of the loop: write outcomes, guard reclaims, purge and claim when
        due; returns (items claimed, whether more may be due, whether purging goes on)."""
        # First: the wake-up path of an idle runner. What it claimed starts before this
        # turn's other work (the loop waits, without the GIL, until a worker took it).
        claiming = not self._stop_requested.is_set() and not self._heartbeat.failing()
        if claiming and self._lanes.claim_notified(cutoff):
            self._ledger.wait_sync_taken(HAND_OFF_WAIT)
        self._log_forfeited(self._ledger.take_forfeited())
        self._writer.write()
        guard_unguarded(self._ledger, self._tally, self._dispatch)
        self._give_back_unanswered()
        purging = schedule.purge_due() and self._purging.batch()
        if purging:
            schedule.purge_next_turn()
        claim_turn, self._purge_run = self._claim_turn(), purging
        # --once is done after a claim that had room for everything found nothing: one
        # made while an attempt (or an outcome not yet written) was held may have had
        # none, and that attempt may have ended by the time the claim returned.
        self._held_nothing = self._ledger.held_count() == 0
        claimed, more_due = 0, False
        if claim_turn and self._may_claim():
            # A lane without room still claims limited work it can start at once.
            wants_more = self._lanes.wants_more()
            if wants_more or self._lanes.limited:
                self._claimed_at = time.monotonic()
                claimed, more_due = self._claim(cutoff, check_stale=wants_more and schedule.stale_check_due())
                self._more_due = more_due
        return claimed, more_due, purging

    def _give_back_unanswered(self) -> None:
        """Claims whose answer an outage lost: pending again before this turn claims. An
        outage is the turn's (raised); any other refusal drops them, so that it cannot
        hold every later claim back: they go stale and are reclaimed, as before."""
        if self._unanswered:
            try:
                released = self._unanswered.give_back()
            except Exception as error:
                if is_database_unavailable(error):
                    raise
                self._unanswered.forget()
                logger.warning(
                    "could not give back claims whose answer was lost (%s); they are reclaimed "
                    "after STALE_AFTER",
                    type(error).__name__,
                )
                return
            if released:
                logger.info(
                    "gave back %d item(s) claimed as the database went away (the claim's answer "
                    "was lost): pending again, due now, attempt unchanged",
                    released,
                )
                wakeup.notify(self.using)  # any runner, this one too, can start them at once

    def _claim_turn(self) -> bool:
        """Whether this turn makes the full claim: every turn, but in a run of purge batches
        (one after another, no wait between them) only as an idle loop would, at each poll
        interval, or at once when an attempt ended (a slot is free) or the last claim left
        due work behind: not one claim per batch. Wake-ups' claims by id run each turn."""
        if self.once or not self._purge_run or self._woken or self._more_due:
            return True
        return time.monotonic() - self._claimed_at >= self.idle_interval()

    def _log_forfeited(self, works: list[ClaimedWork]) -> None:
        if works:
            self.stats.forfeited += len(works)
            logger.warning(
                "not starting %d claimed item(s) (%s): nothing confirmed their claims for over "
                "half of STALE_AFTER (heartbeats failed, or the claim itself took that long), so "
                "another runner may hold them; they go stale and are reclaimed without counting "
                "an attempt",
                len(works),
                ", ".join(f"{work.kind} #{work.id}" for work in works[:10]),
            )

    def _next_wait(self) -> float:
        """How long the loop may sleep: until the next poll (short while wake-ups do not
        arrive), an outcome's retry, or a rate window that held work back freeing a start."""
        wait = self.idle_interval()
        retry_in = self._lanes.retry_in()
        if retry_in is not None:
            wait = min(wait, max(retry_in, 0.005))
        if self._ledger.has_unguarded(self._ledger.clock()):
            wait = min(wait, 0.05)
        next_retry = self._ledger.next_retry()
        if next_retry is not None:
            wait = min(wait, max(0.05, next_retry - time.monotonic()))
        return wait

    def _wants_more(self) -> bool:
        return self._may_claim() and self._lanes.wants_more()

    def _may_claim(self) -> bool:
        """Whether to claim at all: not while stopping, nor while heartbeats fail."""
        if self._stop_requested.is_set():
            return False
        if self._heartbeat.failing():
            # Our claims may be going stale: taking more would only hand them out twice.
            if not self._claims_paused:
                self._claims_paused = True
                logger.warning("no heartbeat for over half of STALE_AFTER; not claiming until one succeeds")
            return False
        if self._claims_paused:
            self._claims_paused = False
            logger.warning("heartbeats succeed again; claiming again")
        return True

    def _claim(self, cutoff: datetime | None, *, check_stale: bool) -> tuple[int, bool]:
        """Claim due work and, when a check is due, stale work; returns (items claimed,
        whether more may be waiting: a claim got all it asked for, or lost rows to another
        runner).

        Each lane claims only as far as it has room (:class:`.lanes.LaneClaims`). Due work
        is handed to the workers before the stale check runs, so a wake-up for new work
        does not wait for it; the stale check may take up to ``concurrency`` rows of
        kinds without limits beyond a full claim, so a busy runner still reclaims a dead
        runner's work, and rows of limited kinds as far as each lane can start them.
        """
        claimed, more, room = self._lanes.claim_due(cutoff)
        if check_stale:
            stale_limit = max(room, self.concurrency)
            self._lanes.claim_stale_limited(self.stale_after, cutoff)
            try:
                # Limited kinds were reclaimed by lane, just above: none here (startable 0).
                stale = self._claimer.claim_stale(
                    stale_limit, stale_after=self.stale_after, now=cutoff, startable=0
                )
            except ClaimInterrupted as interrupted:
                # Reclaimed before the error: held (heart-beaten), guarded next turn.
                self._reclaimed(interrupted.works)
                raise interrupted.error from interrupted.error.__cause__  # as it was raised
            more = more or len(stale) >= stale_limit
            self._reclaimed(stale)
            claimed += guard_unguarded(self._ledger, self._tally, self._dispatch)
        return claimed, more

    def _reclaimed(self, works: list[ClaimedWork]) -> None:
        self.stats.reclaimed += len(works)
        self._observer.claimed(works, reclaimed=True)
        self._ledger.add_unguarded(works)

    # --- database outages -------------------------------------------------------------

    def _connection_failed(self, error: BaseException) -> None:
        """A statement of the main thread met a connection the database is not on."""
        if session_ended_idle(error):
            # The server ended the session while it sat idle (idle_session_timeout): the
            # statement never ran, and a new session runs it at once. Not an outage;
            # at a stop too, where the loop may have waited past the timeout.
            close_connection(self.using)
            logger.debug("the database ended the runner's idle session; reconnecting")
            return
        self._database_lost(error)

    def _database_lost(self, error: BaseException) -> None:
        close_connection(self.using)
        if self._backoff.database_lost():
            self._observer.database_lost()
            logger.warning(
                "database unavailable (%s); holding %d unwritten outcome(s)%s and retrying",
                describe_unavailable(error),
                self._ledger.unwritten_count(),
                _and_counts(self._observer.counts_unwritten),
            )

    def _claim_refused(self, refused: str) -> None:
        """A turn's statement the database answered without running it (a lock wait cut
        short by the role's ``lock_timeout``, a deadlock, a cancel by ``statement_timeout``):
        no outage, the session is fine. Said once (WARNING), then at DEBUG while it lasts;
        the next turn goes after a short pause (the statement itself waited), with no
        back-off: outcomes are written and other work claimed meanwhile."""
        self._refusals += 1
        if self._refusals == 1:
            logger.warning(
                "a statement of the runner's turn did not pass (%s); not an outage: trying "
                "again at the next turn",
                refused,
            )
        else:
            logger.debug("a statement of the runner's turn did not pass again (%s)", refused)
        self._stop_requested.wait(REFUSED_PAUSE)

    def _database_back(self) -> None:
        if self._refusals:
            logger.debug("the runner's turns pass again after %d refused", self._refusals)
            self._refusals = 0
        lasted = self._backoff.succeeded()
        if lasted is not None:
            logger.warning("database reachable again after %.1fs", lasted)

    # --- shutdown ---------------------------------------------------------------------

    def _shutdown(self) -> None:
        try:
            self._stop_all()
        finally:
            self.left_running = self._ledger.running_count()

    def _stop_all(self) -> None:
        Shutdown(
            self._ledger,
            grace=self.shutdown_grace,
            stale_after=self.stale_after.total_seconds(),
            stop_now=self._stop_now,
            wake=self._wake,
            release=self._release,
            write_outcomes=self._try_write_outcomes,
            stop_helpers=self._stop_helpers,
        ).run()

    def _try_write_outcomes(self) -> bool:
        """Write what can be written, the outcomes and then their counts (the dashboard's,
        forced: no wait for ``COUNTS_EVERY``; a sealed batch goes again under its token, so
        nothing is counted twice); whether nothing of either is left to write."""
        try:
            rerun_if_ended_idle(self.using, self._write_outcomes_now)
        except Exception as error:  # noqa: BLE001 - shutting down must not fail
            if is_database_unavailable(error):
                self._connection_failed(error)
            else:
                logger.error("writing outcomes at shutdown failed (%s)", type(error).__name__)
            return False
        return self._ledger.unwritten_count() == 0 and not self._observer.counts_unwritten

    def _write_outcomes_now(self) -> None:
        self._writer.write()  # a batch leaves the ledger once written: none goes twice
        self._give_back_unanswered()  # not waited for: else they go stale, no worse
        if self._ledger.unwritten_count() == 0:  # one upsert per batch of outcomes, at most
            self._observer.outcomes_written(force=True)

    def _release(self, works: list[ClaimedWork], time_is_up: Callable[[], bool]) -> None:
        # Woken by a second signal (events only: libfaketime breaks time.sleep).
        released = release_claims(
            works, time_is_up, using=self.using, on_outage=self._connection_failed, pause=self._stop_now.wait
        )
        if released is None:
            return
        self.stats.released += released
        self._observer.released(works)
        if released:
            with contextlib.suppress(Exception):
                wakeup.notify(self.using)  # another runner can start them at once
        logger.info("released %d claim(s) at shutdown: pending again, due now, attempt unchanged", released)

    def _stop_helpers(self) -> None:
        self._async_pool.stop()
        self._journal.stop()
        self._heartbeat.stop()
        wakeup.remove_local_waiter(self._wake)
        if self._listener is not None:
            self._listener.stop()
        self._observer.stop()
        close_connection(self.using)


def _and_counts(unwritten: int) -> str:
    """The dashboard's outcome counts held too, when there are any (at a stop, they may be
    all that is held)."""
    return f" and the dashboard's counts of {unwritten} outcome(s)" if unwritten else ""

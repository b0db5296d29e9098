"""The heartbeat thread: refreshes every held claim and writes start markers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import DatabaseError, connections

from nexus_workflows import sql
from nexus_workflows.database_errors import statement_refused
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.runner.ledger import Ledger
from nexus_workflows.deferred.runner.unavailable import (
    close_connection,
    close_if_past_max_age,
    rerun_after_deadlocks,
)
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.flow import starts as flow_starts

logger = logging.getLogger("nexus_workflows.deferred.runner")

# Start markers wait this long for company, so quick attempts (which finish first) cost
# no statement and slow ones are marked in one statement per batch.
MARK_STARTED_DELAY = 0.1
# Longest wait for the lock of a row a beat skipped (another session holds it), before the
# thread looks at its other work (start marks, the next beat, a stop) and waits again.
BEHIND_WAIT = 1.0


def heartbeat_failing(since_last: float, *, stale_after: float, interval: float) -> bool:
    """Whether ``since_last`` seconds without a good heartbeat put our claims at risk:
    half of ``stale_after``, but never less than one and a half intervals, so one
    heartbeat's own duration does not pause claiming at every beat."""
    return since_last > max(stale_after / 2, 1.5 * interval)


class Heartbeat:
    """Every ``interval`` seconds, refreshes ``heartbeat_at`` of everything in the ledger
    (so a slow but live attempt is never reclaimed); shortly after attempts start, marks
    them started in one statement. Survives any exception: while heartbeats fail for
    half of ``stale_after`` (:meth:`failing`), the runner stops claiming.

    A row another session holds a lock on (an operator's open transaction, a backfill's
    ``UPDATE``) holds nothing back: a beat or a mark skips it, and between beats the
    thread waits for that row's lock (:meth:`_beat_behind`), so it is the first in line
    when the lock goes: another runner's stale claim skips a locked row, and finds it
    fresh once it is free.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        using: str,
        interval: float,
        stale_after: float,
        on_beat: Callable[[], None],
    ) -> None:
        self.ledger = ledger
        self.using = using
        self.interval = interval
        self.stale_after = stale_after
        self.on_beat = on_beat  # the runner's own row (observability)
        self.last_good = time.monotonic()
        # Held rows the last beat skipped (another session holds their lock; or ended since).
        self._behind: list[ClaimedWork] = []
        self._behind_waited = False  # a wait for them timed out (said once)
        self._marks_left: set[int] = set()  # attempts a mark skipped (a row another session held)
        self.mark_wanted = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nexus-workflows-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop beating (claims then go stale unless released)."""
        self._stop.set()
        self.mark_wanted.set()

    def started(self) -> None:
        """An attempt started: write its marker soon."""
        # Set already, the beat has yet to clear it and then read what is unmarked (this
        # attempt among it): Event.set takes its lock and notifies, for each item.
        if not self.mark_wanted.is_set():
            self.mark_wanted.set()

    def failing(self) -> bool:
        return heartbeat_failing(
            time.monotonic() - self.last_good, stale_after=self.stale_after, interval=self.interval
        )

    def _run(self) -> None:
        next_beat = time.monotonic() + self.interval
        failed_beats = 0
        try:
            while not self._stop.is_set():
                try:
                    if self._behind and not self.mark_wanted.is_set():
                        self._beat_behind(next_beat)
                    else:
                        self.mark_wanted.wait(max(0.0, next_beat - time.monotonic()))
                    if self._stop.is_set():
                        return
                    good_before = self.last_good
                    next_beat = self._turn(next_beat)
                    # Only a beat ends an outage: a turn that had only a start marker to
                    # write (none, when the attempt already ended) touched no database.
                    if failed_beats and self.last_good != good_before:
                        logger.warning("heartbeats work again, after %d failed", failed_beats)
                        failed_beats = 0
                except Exception as error:  # noqa: BLE001 - nothing may end the heartbeats
                    failed_beats += 1
                    # Once per outage: an outage of minutes would otherwise log every interval.
                    logger.log(
                        logging.WARNING if failed_beats == 1 else logging.DEBUG,
                        "heartbeat failed (%s); retrying every %gs",
                        type(error).__name__,
                        self.interval,
                    )
                    close_connection(self.using)
                    next_beat = time.monotonic() + self.interval
                    self._behind = []  # the next beat says again which rows it skipped
        finally:
            connections.close_all()

    def _turn(self, next_beat: float) -> float:
        """Mark started attempts if wanted, beat if due; returns the next beat's time."""
        close_if_past_max_age(self.using)
        if self.mark_wanted.is_set():
            # A rate-limited attempt's window row stays held until its marker confirms it.
            delay = flow_starts.mark_delay(self.ledger.unmarked(), MARK_STARTED_DELAY)
            self._stop.wait(min(delay, self.interval))
            self.mark_wanted.clear()
            self._mark_started()
        if time.monotonic() >= next_beat:
            next_beat = time.monotonic() + self.interval
            held = self.ledger.held()
            began = time.monotonic()
            refreshed: set[int] = set()
            if held:
                # Its connection sits idle between beats: a new one if it died meanwhile.
                # Again at once after a deadlock (with a journal batch, say): not a failed beat.
                refreshed = rerun_after_deadlocks(
                    self.using,
                    lambda: transitions.heartbeat(held, using=self.using),
                    again=lambda said: logger.info(
                        "a heartbeat was not written (%s); writing it again", said
                    ),
                )
            self._behind = [work for work in held if work.id not in refreshed]
            # The rows' heartbeat_at is as old as the statement's sending, not its answer
            # (a lock wait or a stalled commit may lie between): count from there, as a
            # claim's confirmation does (ClaimedWork.sent_at).
            self.last_good = began
            self.ledger.confirm(began, refreshed)
            if self._marks_left:  # a mark skipped a row another session held: again now
                self._mark_started(self._marks_left)
            # The runner's row after the claims, and never waiting long (the observer
            # bounds its lock waits): bookkeeping must not hold back the claims' beat.
            self.on_beat()
        return next_beat

    def _mark_started(self, only: set[int] | None = None) -> None:
        """Mark the attempts started and not marked yet (of the ids ``only``, when given)."""
        started = [work for work in self.ledger.unmarked() if only is None or work.id in only]
        if started:
            done = rerun_after_deadlocks(
                self.using,
                lambda: transitions.mark_started(started, using=self.using),
                again=lambda said: logger.info("start marks were not written (%s); writing them again", said),
            )
            # A row another session holds stays unmarked: tried again with the next marks,
            # and at every beat.
            self.ledger.marked([work for work in started if work.id in done])
            self._marks_left = {work.id for work in started if work.id not in done}

    def _beat_behind(self, next_beat: float, most: float = BEHIND_WAIT) -> None:
        """Beat the rows the last beat skipped, waiting for their locks until the next
        beat is due (at most ``most`` seconds); rows that ended meanwhile match nothing
        and wait for nothing. A wait cut short is no failed beat: the others were beaten."""
        seconds = min(max(next_beat - time.monotonic(), 0.05), most)
        behind = self._behind
        began = time.monotonic()
        try:
            with sql.for_connection(self.using).lock_waits_at_most(self.using, seconds):
                refreshed = transitions.heartbeat_waiting(behind, using=self.using)
        except DatabaseError as error:
            if statement_refused(error) is None:
                raise
            if not self._behind_waited:
                self._behind_waited = True
                logger.warning(
                    "heartbeat waits for %d item(s) whose row another session holds a lock on "
                    "(%s); they go stale if it is held for STALE_AFTER",
                    len(behind),
                    ", ".join(f"{work.kind} #{work.id}" for work in behind[:10]),
                )
            return
        if self._behind_waited:
            logger.warning("heartbeat reached the %d item(s) it waited for", len(behind))
            self._behind_waited = False
        self._behind = []
        # Only the rows it refreshed: a queued claim lost meanwhile (to another runner's
        # stale claim) must not look confirmed, or it would start a second time.
        self.ledger.confirm(began, refreshed)

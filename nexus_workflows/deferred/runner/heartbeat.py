"""The heartbeat thread: refreshes every held claim and writes start markers."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connections

from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.runner.ledger import Ledger
from nexus_workflows.deferred.runner.unavailable import (
    close_connection,
    close_if_past_max_age,
    rerun_after_deadlocks,
)
from nexus_workflows.flow import starts as flow_starts

logger = logging.getLogger("nexus_workflows.deferred.runner")

# Start markers wait this long for company, so quick attempts (which finish first) cost
# no statement and slow ones are marked in one statement per batch.
MARK_STARTED_DELAY = 0.1


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
                self.mark_wanted.wait(max(0.0, next_beat - time.monotonic()))
                if self._stop.is_set():
                    return
                try:
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
            if held:
                # Its connection sits idle between beats: a new one if it died meanwhile.
                # Again at once after a deadlock (with a journal batch, say): not a failed beat.
                rerun_after_deadlocks(
                    self.using,
                    lambda: transitions.heartbeat(held, using=self.using),
                    again=lambda said: logger.info(
                        "a heartbeat was not written (%s); writing it again", said
                    ),
                )
            # The rows' heartbeat_at is as old as the statement's sending, not its answer
            # (a lock wait or a stalled commit may lie between): count from there, as a
            # claim's confirmation does (ClaimedWork.sent_at).
            self.last_good = began
            self.ledger.confirm(began)
            # The runner's row after the claims, and never waiting long (the observer
            # bounds its lock waits): bookkeeping must not hold back the claims' beat.
            self.on_beat()
        return next_beat

    def _mark_started(self) -> None:
        started = self.ledger.unmarked()
        if started:
            rerun_after_deadlocks(
                self.using,
                lambda: transitions.mark_started(started, using=self.using),
                again=lambda said: logger.info("start marks were not written (%s); writing them again", said),
            )
            self.ledger.marked(started)

"""Stopping a runner: what happens to its claims, in which order."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.runner.ledger import Ledger
from nexus_workflows.deferred.runner.unavailable import is_database_unavailable, rerun_if_ended_idle
from nexus_workflows.deferred.transitions import ClaimedWork

logger = logging.getLogger("nexus_workflows.deferred.runner")


def release_claims(
    works: list[ClaimedWork],
    time_is_up: Callable[[], bool],
    *,
    using: str,
    on_outage: Callable[[BaseException], None],
    pause: Callable[[float], object],  # e.g. Event.wait: what it returns is not used
) -> int | None:
    """Give back claims of work not started (pending again, due now, attempt unchanged),
    retrying through an outage until ``time_is_up()`` (the grace ended, or a second
    signal ended it); the number released, or None when they could not be (they go
    stale and are reclaimed, no worse). A session the server ended while the loop sat
    idle is no outage: renewed at once, even when no grace is left."""
    while True:
        try:
            return rerun_if_ended_idle(using, lambda: transitions.release(works))
        except Exception as error:  # noqa: BLE001 - unreleased claims go stale, no worse
            if not is_database_unavailable(error):
                logger.error("releasing claims failed (%s)", type(error).__name__)
                return None
            on_outage(error)
            if time_is_up():
                logger.error(
                    "could not release %d claim(s) before exiting; they will be reclaimed after STALE_AFTER",
                    len(works),
                )
                return None
            pause(0.2)


class Shutdown:
    """The order of a runner's stop; every part it drives is injected.

    1. the ledger closes: nothing more starts, and work claimed but not started is
       handed to ``release`` (with a test of whether the grace is over);
    2. attempts still running get ``grace`` seconds (none once ``stop_now`` is set),
       while ``write_outcomes`` writes what finishes;
    3. outcomes that arrived are flushed until the grace ends, and for at least
       ``min(grace, 5)`` seconds;
    4. what is left is reported (those claims are kept, unrefreshed: another runner
       takes them after ``STALE_AFTER``, never while they may still run here);
    5. ``stop_helpers`` stops the heartbeat, listener and observer.

    ``stop_now`` (a second signal) ends the grace when it is set, whichever step runs
    then: a release or a flush retrying through an outage stops too.

    Never two executions of one item at once: an attempt still running when the grace
    ends keeps its claim; releasing it would let another runner start the item while
    this one still runs it.
    """

    def __init__(
        self,
        ledger: Ledger,
        *,
        grace: float,
        stale_after: float,
        stop_now: threading.Event,
        wake: threading.Event,
        release: Callable[[list[ClaimedWork], Callable[[], bool]], None],
        write_outcomes: Callable[[], bool],
        stop_helpers: Callable[[], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.grace = grace
        self.stale_after = stale_after
        self.stop_now = stop_now
        self.wake = wake
        self.release = release
        self.write_outcomes = write_outcomes
        self.stop_helpers = stop_helpers
        self.monotonic = monotonic
        self.unguarded = 0
        self._pause = threading.Event()  # events only: libfaketime breaks time.sleep
        # When stop_now was first seen set: the grace ends there.
        self._stopped_now_at: float | None = None

    def run(self) -> None:
        # Reclaimed work the crash-loop guard has not checked yet is not released: pending
        # again, the next claim would run it with no guard, past its retry schedule. It
        # goes stale and is reclaimed (and checked) again, without counting an attempt.
        self.unguarded = len(self.ledger.take_unguarded())
        unstarted = self.ledger.close()
        grace_ends = self.monotonic() + self.grace
        if unstarted:
            self.release(unstarted, lambda: self.monotonic() >= self._grace_end(grace_ends))
        self._wait_for_running(grace_ends)
        self._flush(grace_ends, self.monotonic() + min(self.grace, 5.0))
        self._report_left()
        self.stop_helpers()

    def _grace_end(self, grace_ends: float) -> float:
        """When the grace ends: ``grace_ends``, or when ``stop_now`` was first seen set."""
        if self._stopped_now_at is None and self.stop_now.is_set():
            self._stopped_now_at = self.monotonic()
        if self._stopped_now_at is None:
            return grace_ends
        return min(grace_ends, self._stopped_now_at)

    def _wait_for_running(self, grace_ends: float) -> None:
        while self.ledger.running_count() and self.monotonic() < self._grace_end(grace_ends):
            self.wake.wait(0.05)
            self.wake.clear()
            self.write_outcomes()

    def _flush(self, grace_ends: float, at_least_until: float) -> None:
        # Outcomes of finished attempts only: a write that keeps failing is left to go
        # stale, like a running attempt.
        while not self.write_outcomes():
            if self.monotonic() >= max(self._grace_end(grace_ends), at_least_until):
                return
            self._pause.wait(0.2)

    def _report_left(self) -> None:
        still_running = self.ledger.running_count()
        unwritten = self.ledger.unwritten_count()
        if still_running or unwritten or self.unguarded:
            logger.warning(
                "exiting with %d attempt(s) still running, %d outcome(s) unwritten and %d "
                "reclaimed item(s) not yet checked against their retry schedule: their "
                "claims are kept and no longer refreshed, so other runners take them over "
                "after STALE_AFTER (%gs), never while they may still run here",
                still_running,
                unwritten,
                self.unguarded,
                self.stale_after,
            )


def end_process(code: int = 0) -> NoReturn:
    """End this process now, with attempts still running in it.

    Python's own exit would first join every non-daemon thread: those of
    ``asyncio.to_thread`` and of every async ORM call among them, so a blocked call would
    keep the process, and its attempt, alive after the claims stopped being refreshed,
    until another runner took them over and ran them too. The ``atexit`` functions (an
    error reporter's flush) and the log handlers still run first.
    """
    try:
        atexit._run_exitfuncs()
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)

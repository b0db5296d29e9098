"""Waiting out database outages and loop errors with a growing back-off."""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_BACKOFF = 10.0


class Backoff:
    """The main loop's back-off state; pure bookkeeping, no I/O.

    An outage starts at the first :meth:`database_lost` (which bumps ``epoch``, so
    workers re-check their connections) and waits ``min(0.5, poll_interval)``, doubling
    per further failure up to :data:`MAX_BACKOFF`. Any other loop error waits at least
    0.5 s, doubling likewise. :meth:`succeeded` resets the wait and ends the outage.
    """

    def __init__(self, poll_interval: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.poll_interval = poll_interval
        self.delay = 0.0
        self.epoch = 0
        self.outage_started: float | None = None
        self._monotonic = monotonic

    @property
    def in_outage(self) -> bool:
        return self.outage_started is not None

    def database_lost(self) -> bool:
        """Record a failed database call; True when this starts a new outage."""
        if self.outage_started is None:
            self.epoch += 1
            self.outage_started = self._monotonic()
            self.delay = min(0.5, self.poll_interval)
            return True
        self.delay = min(self.delay * 2, MAX_BACKOFF)
        return False

    def loop_error(self) -> None:
        """Record an unexpected error of one loop turn."""
        self.delay = min(max(self.delay * 2, 0.5), MAX_BACKOFF)

    def succeeded(self) -> float | None:
        """Record a good loop turn; the outage's length in seconds if one just ended."""
        self.delay = 0.0
        if self.outage_started is None:
            return None
        lasted = self._monotonic() - self.outage_started
        self.outage_started = None
        return lasted

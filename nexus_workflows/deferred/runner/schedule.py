"""When the main loop next checks for stale work and purges expired rows."""

from __future__ import annotations

import time


class LoopSchedule:
    """Two timers of the main loop; each ``…_due()`` answers and, when due, rearms."""

    def __init__(self, stale_check_every: float, sweep_interval: float) -> None:
        self.stale_check_every = stale_check_every
        self.sweep_interval = sweep_interval
        self.next_stale_check = 0.0
        self.next_purge = 0.0

    def stale_check_due(self) -> bool:
        if time.monotonic() < self.next_stale_check:
            return False
        self.next_stale_check = time.monotonic() + self.stale_check_every
        return True

    def purge_due(self) -> bool:
        if time.monotonic() < self.next_purge:
            return False
        self.next_purge = time.monotonic() + self.sweep_interval
        return True

    def purge_next_turn(self) -> None:
        """More to purge (a full batch, a smaller one after a cancel, or the retry of one
        that met another transaction): next turn, not a sweep interval later."""
        self.next_purge = 0.0

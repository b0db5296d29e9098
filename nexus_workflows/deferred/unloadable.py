"""Django tasks that could not be loaded lately, so that showing their rows does not try
to import them again for each row (a failed import is not cached by Python: each try
searches ``sys.path`` again). Bounded in time: a deploy may add the module, and a
process that stays up then finds it within :data:`RECHECK_AFTER` seconds."""

from __future__ import annotations

import threading
import time

#: Seconds a task path that could not be loaded is taken as such without trying again.
RECHECK_AFTER = 30.0


class RecentlyUnloadable:
    """Task paths (with their backend alias) whose load failed within ``RECHECK_AFTER``
    seconds; entries expire, so the set holds only the paths failed in that time."""

    def __init__(self, recheck_after: float = RECHECK_AFTER) -> None:
        self.recheck_after = recheck_after
        self._until: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def __contains__(self, key: tuple[str, str]) -> bool:
        until = self._until.get(key)
        return until is not None and time.monotonic() < until

    def remember(self, key: tuple[str, str]) -> None:
        now = time.monotonic()
        with self._lock:
            self._forget_expired(now)
            self._until[key] = now + self.recheck_after

    def forget(self) -> None:
        """Try every task path again at its next lookup."""
        with self._lock:
            self._until.clear()

    def _forget_expired(self, now: float) -> None:
        for key in [key for key, until in self._until.items() if until <= now]:
            del self._until[key]

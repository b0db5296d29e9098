"""Saves put off because another session holds a lock on their row.

The journal writer's batch skips a row another session holds a lock on (an operator's open
transaction, a backfill, the heartbeat's beat) instead of waiting for it: waiting held
every other save of the batch (up to 200 attempts) back for as long as the lock was held.
The skipped save waits here and is written again a moment later, the wait doubling from
:data:`FIRST_WAIT` up to :data:`LONGEST_WAIT`, until it is written or its claim is lost,
or until it has waited as long as the session would have waited for the lock inside a
statement (``lock_timeout``, ``innodb_lock_wait_timeout``): then it fails with the
database's own error for that lock (see ``JournalWriter``).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterable
from typing import Generic, TypeVar

#: Seconds before a put-off save is first written again: a beat's or a mark's lock lasts a
#: few milliseconds.
FIRST_WAIT = 0.01
#: The longest wait between two tries of one save: how late it may be written after the
#: lock is let go.
LONGEST_WAIT = 0.5

T = TypeVar("T")


def wait_before_try(tries: int) -> float:
    """Seconds to wait before the next try of a save put off ``tries`` times already."""
    return min(LONGEST_WAIT, FIRST_WAIT * 2 ** min(tries, 16))


class HeldSaves(Generic[T]):
    """Saves waiting for their next try, soonest first; safe to use from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._heap: list[tuple[float, int, T]] = []
        self._order = itertools.count()  # ties in time keep their order; saves are not compared

    def put_off(self, saves: Iterable[tuple[T, float]]) -> None:
        """Each save, to be tried again after its wait (seconds)."""
        now = time.monotonic()
        with self._lock:
            for save, wait in saves:
                heapq.heappush(self._heap, (now + wait, next(self._order), save))

    def due(self) -> list[T]:
        """The saves whose wait is over, taken out."""
        now, ready = time.monotonic(), []
        with self._lock:
            while self._heap and self._heap[0][0] <= now:
                ready.append(heapq.heappop(self._heap)[2])
        return ready

    def seconds_to_next(self) -> float | None:
        """Seconds until the next save's wait is over; None when none waits."""
        with self._lock:
            return max(0.0, self._heap[0][0] - time.monotonic()) if self._heap else None

    def take_all(self) -> list[T]:
        with self._lock:
            saves = [save for _, _, save in self._heap]
            self._heap.clear()
        return saves

"""Saves put off because another session holds a lock on their row.

The journal writer's batch skips a row another session holds a lock on (an operator's open
transaction, a backfill, the heartbeat's beat) instead of waiting for it: waiting held
every other save of the batch (up to 200 attempts) back for as long as the lock was held.
The skipped save waits here :data:`BETWEEN_TRIES`, then a writer writes it alone, waiting
in the row lock's queue like any statement, at most :data:`HELD_WAIT` at a time, in turn
with the other saves it writes; until it is written, its claim is found lost, or it has
waited as long as the session's own limit (see ``JournalWriter._write_held``).

Skipping alone would not do for the held save itself: a row whose lock passes from one
holder to the next (sessions queued on it) is never free between them, and a skipping
try never lands; a waiting statement gets it at the next commit.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterable
from typing import Generic, TypeVar

#: Seconds a put-off save waits before it is written alone: a beat's or a mark's lock
#: lasts a few milliseconds; and between two of its waits in the lock's queue.
BETWEEN_TRIES = 0.01
#: Seconds a held save waits in its row lock's queue at a time: the most its writer's
#: other saves wait for it.
HELD_WAIT = 0.1
#: Seconds an idle writer waits on its queue before it looks at the put-off saves again
#: (another writer may have put one off meanwhile).
IDLE_WAKE = 0.5

T = TypeVar("T")


class HeldSaves(Generic[T]):
    """Saves waiting for their next try, in the order they were put off (each waits the
    same time); safe to use from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: collections.deque[tuple[float, T]] = collections.deque()

    def put_off(self, saves: Iterable[T], wait: float) -> None:
        """Each save, to be tried again after ``wait`` seconds."""
        due = time.monotonic() + wait
        with self._lock:
            self._waiting.extend((due, save) for save in saves)

    def take_due(self) -> T | None:
        """The first save whose wait is over, taken out; None if none is."""
        with self._lock:
            if self._waiting and self._waiting[0][0] <= time.monotonic():
                return self._waiting.popleft()[1]
        return None

    def seconds_to_next(self, *, at_most: float) -> float:
        """Seconds until the next save's wait is over, at most ``at_most``."""
        with self._lock:
            if not self._waiting:
                return at_most
            return min(at_most, max(0.0, self._waiting[0][0] - time.monotonic()))

    def take_all(self) -> list[T]:
        with self._lock:
            saves = [save for _, save in self._waiting]
            self._waiting.clear()
        return saves

"""Everything a runner holds, by stage, under one lock."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from ..claims import ClaimedWork
from ..execution import Outcome


@dataclass
class Pending:
    """An outcome not written yet, and when its write may be tried again."""

    outcome: Outcome
    failures: int = 0
    retry_at: float = 0.0


class Ledger:
    """The claims one runner holds, by stage; thread-safe, no I/O.

    A claim is *queued* (claimed, not started), *running* (its attempt has started;
    *unmarked* too until the start marker is written), *unwritten* (finished, outcome not
    written yet) or *unguarded* (reclaimed, crash-loop guard not written yet). Every held
    claim is heart-beaten. Running attempts are keyed by claim, not row: a row may be
    reclaimed while an old attempt still runs.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._work_available = threading.Condition(self.lock)
        self._queued: deque[ClaimedWork] = deque()
        self._running: dict[tuple[str, int], ClaimedWork] = {}
        self._unmarked: dict[tuple[str, int], ClaimedWork] = {}
        self._unwritten: list[Pending] = []
        self._unguarded: list[ClaimedWork] = []
        self._closed = False

    # --- queued and running -------------------------------------------------------------

    def dispatch(self, works: list[ClaimedWork]) -> None:
        """Queue claimed work for the workers (wakes as many as items)."""
        if works:
            with self._work_available:
                self._queued.extend(works)
                self._work_available.notify(len(works))

    def take(self) -> ClaimedWork | None:
        """Block until queued work (now running, unmarked) or :meth:`close` (None)."""
        with self._work_available:
            while not self._queued and not self._closed:
                self._work_available.wait()
            if not self._queued:
                return None
            work = self._queued.popleft()
            self._running[work.key] = work
            self._unmarked[work.key] = work
            return work

    def finished(self, work: ClaimedWork) -> None:
        """The attempt of ``work`` ended (its outcome goes to the writer)."""
        with self.lock:
            self._running.pop(work.key, None)
            self._unmarked.pop(work.key, None)

    def close(self) -> list[ClaimedWork]:
        """Stop handing out work; returns (and forgets) what was claimed but not started."""
        with self._work_available:
            unstarted = [*self._queued, *self._unguarded]
            self._queued.clear()
            self._unguarded = []
            self._closed = True
            self._work_available.notify_all()
        return unstarted

    def running_count(self) -> int:
        with self.lock:
            return len(self._running)

    def free_slots(self, slots: int) -> int:
        """Of ``slots`` workers, how many have nothing to run nor queued for them."""
        with self.lock:
            return slots - len(self._queued) - len(self._running)

    # --- start markers ------------------------------------------------------------------

    def unmarked(self) -> list[ClaimedWork]:
        with self.lock:
            return list(self._unmarked.values())

    def marked(self, works: list[ClaimedWork]) -> None:
        with self.lock:
            for work in works:
                self._unmarked.pop(work.key, None)

    # --- outcomes -----------------------------------------------------------------------

    def add_unwritten(self, pending: Pending) -> None:
        with self.lock:
            self._unwritten.append(pending)

    def due_unwritten(self, now: float) -> list[Pending]:
        with self.lock:
            return [pending for pending in self._unwritten if pending.retry_at <= now]

    def written(self, batch: list[Pending]) -> None:
        done = {id(pending) for pending in batch}
        with self.lock:
            self._unwritten = [pending for pending in self._unwritten if id(pending) not in done]

    def unwritten_count(self) -> int:
        with self.lock:
            return len(self._unwritten)

    def next_retry(self) -> float | None:
        """When the earliest outcome whose write failed may be tried again."""
        with self.lock:
            retries = [pending.retry_at for pending in self._unwritten if pending.failures]
        return min(retries) if retries else None

    # --- reclaimed ----------------------------------------------------------------------

    def add_unguarded(self, works: list[ClaimedWork]) -> None:
        with self.lock:
            self._unguarded.extend(works)

    def take_unguarded(self) -> list[ClaimedWork]:
        with self.lock:
            works, self._unguarded = self._unguarded, []
        return works

    def has_unguarded(self) -> bool:
        with self.lock:
            return bool(self._unguarded)

    # --- everything ---------------------------------------------------------------------

    def held(self) -> list[ClaimedWork]:
        """Every claim to heart-beat."""
        with self.lock:
            return [
                *self._queued,
                *self._running.values(),
                *(pending.outcome.work for pending in self._unwritten),
                *self._unguarded,
            ]

    def held_count(self) -> int:
        with self.lock:
            return len(self._queued) + len(self._running) + len(self._unwritten) + len(self._unguarded)

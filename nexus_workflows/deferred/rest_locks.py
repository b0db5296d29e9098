"""The advisory locks a busy runner holds, on its ``LISTEN`` session, for the limited kinds
it rests (PostgreSQL; migration 0017).

A busy runner holds no waiting lock, so the work table's trigger would not wake it, and it
asks a limited kind that found nothing only now and then (``flow.claiming``). While such a
kind rests, the runner holds the kind's rest lock shared, and the trigger sends its
``NOTIFY`` when it cannot take the lock of a kind it inserted; otherwise an enqueue of a
limited kind sends none (a runner not resting the kind asks it every turn).

No wake-up is lost when a rest begins as an enqueue commits: the enqueue's trigger takes
the kind's lock for the rest of its transaction, so taking the shared lock waits until
that enqueue has committed (or rolled back), and once it holds the lock the runner asks
the kind once more (``on_held``), in a transaction that began after that commit: it sees
the row. An enqueue whose trigger runs after the lock is held cannot take it and
notifies. Until the lock is held (wake-ups not working, a long enqueue transaction still
open) the kind rests at most ``flow.claiming._REST``, as on databases without ``NOTIFY``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nexus_workflows.sql import postgresql

#: Seconds the listener waits for a kind's rest lock, held back by an enqueue of the kind
#: whose transaction is still open, before it tries again at its next turn (short: the
#: listener handles no notification meanwhile, and the kind's rest is bounded anyway).
REST_LOCK_TIMEOUT = 0.1


class RestLocks:
    """The rest locks one listener session holds. ``want`` from the runner's thread,
    the rest from the listener's."""

    def __init__(self, on_held: Callable[[str], None] | None = None) -> None:
        self._wanted: frozenset[str] = frozenset()
        self.held: set[str] = set()
        # Called (listener thread) once a kind's lock is held: ask the kind once more.
        self.on_held = on_held

    def want(self, kinds: frozenset[str]) -> bool:
        """The kinds the runner rests now; returns whether that changed."""
        if kinds == self._wanted:
            return False
        self._wanted = kinds
        return True

    def settle(self, connection: Any, *, listening: bool) -> None:
        """Hold the locks of the kinds wanted while wake-ups work; release the others."""
        import psycopg

        wanted = self._wanted if listening else frozenset()
        for kind in sorted(self.held - wanted):
            postgresql.release_rest_lock(connection, kind)
            self.held.discard(kind)
        for kind in sorted(wanted - self.held):
            try:
                postgresql.hold_rest_lock(connection, kind, lock_timeout=REST_LOCK_TIMEOUT)
            except psycopg.errors.LockNotAvailable:
                continue  # an enqueue of the kind is still open: the next turn tries again
            self.held.add(kind)
            if self.on_held is not None:
                self.on_held(kind)

    def lost(self) -> None:
        """The session ended, and its locks with it."""
        self.held.clear()

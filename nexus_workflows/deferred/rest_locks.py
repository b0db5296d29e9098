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

A kind resting because every slot is held needs no wake-up for an enqueue, but one for an
attempt of it ending on another runner: its lock is of another class
(``ENDING_LOCK_CLASS``), which the work table's row trigger tries when such an attempt's
row leaves ``processing`` (migration 0019), with the same protocol.
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
        self._wanted: frozenset[tuple[int, str]] = frozenset()
        self._held: set[tuple[int, str]] = set()
        # Called (listener thread) once a kind's lock is held: ask the kind once more.
        self.on_held = on_held

    @property
    def held(self) -> set[str]:
        """The kinds whose rest lock (enqueues notify) this session holds."""
        return {kind for lock_class, kind in self._held if lock_class == postgresql.REST_LOCK_CLASS}

    @property
    def held_ending(self) -> set[str]:
        """The kinds whose ending lock (their attempts' ends notify) this session holds."""
        return {kind for lock_class, kind in self._held if lock_class == postgresql.ENDING_LOCK_CLASS}

    def want(self, kinds: frozenset[str], ending: frozenset[str] = frozenset()) -> bool:
        """The kinds the runner rests now (``ending``: until an attempt of theirs ends);
        returns whether that changed."""
        wanted = frozenset(
            [(postgresql.REST_LOCK_CLASS, kind) for kind in kinds]
            + [(postgresql.ENDING_LOCK_CLASS, kind) for kind in ending]
        )
        if wanted == self._wanted:
            return False
        self._wanted = wanted
        return True

    def settle(self, connection: Any, *, listening: bool) -> None:
        """Hold the locks of the kinds wanted while wake-ups work; release the others."""
        import psycopg

        wanted = self._wanted if listening else frozenset()
        for lock_class, kind in sorted(self._held - wanted):
            postgresql.release_rest_lock(connection, kind, lock_class)
            self._held.discard((lock_class, kind))
        for lock_class, kind in sorted(wanted - self._held):
            try:
                postgresql.hold_rest_lock(
                    connection, kind, lock_timeout=REST_LOCK_TIMEOUT, lock_class=lock_class
                )
            except psycopg.errors.LockNotAvailable:
                continue  # an enqueue (an end) of the kind is still open: the next turn tries again
            self._held.add((lock_class, kind))
            if self.on_held is not None:
                self.on_held(kind)

    def lost(self) -> None:
        """The session ended, and its locks with it."""
        self._held.clear()

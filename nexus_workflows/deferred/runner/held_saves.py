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
import logging
import threading
import time
from collections.abc import Iterable
from typing import Generic, TypeVar

from nexus_workflows.database_errors import is_lock_wait_cut_short, is_query_canceled
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.runner.journal_saves import Save, claim_lost, complete_once, own_copy, stopped
from nexus_workflows.deferred.runner.unavailable import (
    close_connection,
    close_if_past_max_age,
    rerun_on_a_new_connection,
)

logger = logging.getLogger("nexus_workflows.deferred.runner")

#: Seconds a put-off save waits before it is written alone: a beat's or a mark's lock
#: lasts a few milliseconds; and between two of its waits in the lock's queue.
BETWEEN_TRIES = 0.01
#: Seconds a held save waits in its row lock's queue at a time: the most its writer's
#: other saves wait for it.
HELD_WAIT = 0.1
#: Seconds an idle writer waits on its queue before it looks at the put-off saves again
#: (another writer may have put one off meanwhile).
IDLE_WAKE = 0.5
#: Seconds a save waits for its row, held by another session's lock, before it is said.
HELD_SAID_AFTER = 1.0

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


class WritesHeldSaves:
    """The journal writer's side of the saves put off: put off, taken in turn, written
    alone (``JournalWriter`` is one; it sets the attributes below)."""

    using: str
    _lock: threading.Lock
    _stopped: bool
    _held: HeldSaves[Save]
    _in_hand: dict[int, list[Save]]

    def _put_off(self, saves: list[Save]) -> None:
        """Saves whose row another session holds, written again after a moment."""
        if not saves:
            return
        with self._lock:
            if not self._stopped:
                self._held.put_off(saves, BETWEEN_TRIES)
                return
        complete_once(saves, lambda save: stopped(save.work))

    def _write_one_held(self) -> None:
        """One put-off save whose wait is over, if any (none once stopping: the stop fails
        them), written alone, waiting for its row's lock (see _write_held)."""
        with self._lock:  # taken and in hand at once: a stop that gives up on us fails it
            save = None if self._stopped else self._held.take_due()
            if save is None:
                return
            self._in_hand[threading.get_ident()] = [save]
        try:
            close_if_past_max_age(self.using)
            again = self._write_held(save)
        finally:
            with self._lock:
                self._in_hand.pop(threading.get_ident(), None)
        self._put_off([save] if again else [])

    def _write_held(self, save: Save) -> bool:
        """Write a save whose row another session held: alone, in the row lock's queue as
        any waiting statement (a lock that passes from holder to holder is had at the next
        commit), but waiting at most :data:`HELD_WAIT` at a time, so that this writer's
        other saves wait no longer. True: that wait was cut short, to be tried again.
        Once the save has waited as long as the session's own limit (``lock_timeout``,
        ``statement_timeout``, ``innodb_lock_wait_timeout``, ``max_statement_time``), the
        cut-short wait's error (the database's lock error) is the save's."""
        try:
            # Any writer may take it, one idle for long: on a new connection if that one died.
            written = rerun_on_a_new_connection(
                self.using,
                lambda: transitions.save_journal_waiting(save.work, save.checkpoints, at_most=HELD_WAIT),
            )
        except Exception as error:  # noqa: BLE001 - the attempt decides (outage rules)
            failed: BaseException = error
        else:
            complete_once([save], lambda save: None if written else claim_lost(save.work))
            return False
        if is_lock_wait_cut_short(failed) or is_query_canceled(failed):  # (MariaDB's 1 s least)
            try:
                again = not self._waited_its_limit(save)
            except Exception as error:  # noqa: BLE001 - the attempt decides (outage rules)
                close_connection(self.using)
                failed, again = error, False
            if again:
                self._say_held(save)
                return True
        else:
            close_connection(self.using)  # the next statement reconnects
        complete_once([save], lambda save: own_copy(failed))
        return False

    def _waited_its_limit(self, save: Save) -> bool:
        limit = transitions.lock_wait_limit(self.using)
        return limit is not None and time.monotonic() - (save.held_since or 0.0) >= limit

    def _say_held(self, save: Save) -> None:
        """Once per save, after a second: which row it waits for (kind and id only)."""
        if save.held_said or time.monotonic() - (save.held_since or 0.0) < HELD_SAID_AFTER:
            return
        save.held_said = True
        logger.info(
            "a save of %s #%s waits for its row, which another session holds a lock on",
            save.work.kind,
            save.work.id,
        )

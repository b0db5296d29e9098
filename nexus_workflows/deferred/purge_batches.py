"""How many rows the next purge batch deletes; pure bookkeeping, no I/O.

The runner purges in its loop thread, between its claims: while a batch runs, due work
waits. So a batch is sized to take about a time budget (``PURGE_BATCH_SECONDS``, less
where the database's ``statement_timeout`` is shorter), never to delete more than
``PURGE_BATCH_SIZE`` rows. Only full batches say how long a batch of that size takes; a
partial one (the last of a purge) is not counted either way.

- The first batch is small (:data:`FIRST_SIZE` rows): the runner knows nothing yet of how
  slow this table's deletes are. While full batches are quick (under half the budget), it
  grows at once toward three quarters of the budget, at most tenfold a batch, until a
  batch is not quick or one is cancelled.
- A full batch over the budget shrinks the next in proportion, to three quarters of it.
- From then on it doubles only after :data:`GROW_AFTER` quick full batches in a row, so a
  noisy table does not see-saw.
- A batch the database cancels (``QueryCanceled``, SQLSTATE 57014: its ``statement_timeout``,
  or ``pg_cancel_backend``; both look alike and are treated alike) halves the size, to a
  floor of one row, and the purge carries on with smaller batches. The budget is then at
  most half of the session's real ``statement_timeout`` (read after the cancel), so a
  grown batch stays well clear of it, however soon a hand-made cancel came; where the
  timeout cannot be read (not PostgreSQL), at most half of the longest a cancelled batch
  ran, the timeout as far as the runner can tell.
"""

from __future__ import annotations

#: The size of the first batch, before anything is known of the table's deletes.
FIRST_SIZE = 10
#: Full batches in a row, each quick, before the size doubles again (after the first
#: batch that was not quick).
GROW_AFTER = 3
#: A full batch is quick when it took under 1/QUICK_FRACTION of the budget: twice its
#: size should then take under the budget.
QUICK_FRACTION = 2
#: A size chosen from a batch's time aims at this share of the budget: in the middle of
#: the band of sizes left alone (between quick and over the budget).
AIM = 0.75
#: The most the size grows at once from one quick batch while it ramps up.
RAMP_FACTOR = 10


class PurgeBatchSize:
    """The purge's batch size; :meth:`completed` and :meth:`cancelled` report each batch.

    ``target`` is the seconds one batch should take at most (``PURGE_BATCH_SECONDS``).
    """

    def __init__(self, maximum: int, target: float) -> None:
        self.maximum = max(1, maximum)
        self.target = target
        self.size = min(self.maximum, FIRST_SIZE)
        # What the database lets one statement take (seconds): its statement_timeout, or
        # (not PostgreSQL) the longest a cancelled batch ran; None until a cancel, and
        # when the session has no statement_timeout.
        self.statement_limit: float | None = None
        self.cancelled_after: float | None = None
        self.was_cancelled = False
        self._ramping = True
        self._quick_in_a_row = 0

    @property
    def budget(self) -> float:
        """Seconds one batch should take at most."""
        if self.statement_limit is None:
            return self.target
        return min(self.target, self.statement_limit / 2)

    def completed(self, deleted: int, seconds: float) -> bool:
        """A batch of ``size`` rows deleted ``deleted`` in ``seconds``; whether the size changed."""
        if deleted < self.size:
            return False  # the last of a purge: says nothing of a full batch
        if seconds > self.budget:
            self._ramping = False
            self._quick_in_a_row = 0
            return self._resize(min(self.size - 1, self._scaled(seconds)))
        if seconds * QUICK_FRACTION >= self.budget:
            self._ramping = False  # in the band: the size fits
            self._quick_in_a_row = 0
            return False
        if self._ramping:
            return self._resize(min(self.size * RAMP_FACTOR, max(self.size + 1, self._scaled(seconds))))
        self._quick_in_a_row += 1
        if self._quick_in_a_row < GROW_AFTER:
            return False
        self._quick_in_a_row = 0
        return self._resize(self.size * 2)

    def cancelled(self, seconds: float, statement_timeout: float | None) -> bool:
        """A batch of ``size`` rows was cancelled after ``seconds``, its session's
        ``statement_timeout`` being ``statement_timeout`` seconds (0: none; None: unknown);
        whether the size shrank (not when it was one row already)."""
        self.was_cancelled = True
        self.cancelled_after = max(self.cancelled_after or 0.0, seconds)
        if statement_timeout is None:
            self.statement_limit = self.cancelled_after
        else:
            # The real limit, whatever cut this batch short (a pg_cancel_backend too).
            self.statement_limit = statement_timeout or None
        self._ramping = False
        self._quick_in_a_row = 0
        return self._resize(self.size // 2)

    def _scaled(self, seconds: float) -> int:
        """The size a batch that took ``seconds`` would have had to aim at the budget."""
        if seconds <= 0:
            return self.maximum
        return int(self.size * self.budget * AIM / seconds)

    def _resize(self, size: int) -> bool:
        before, self.size = self.size, max(1, min(self.maximum, size))
        return self.size != before


def rows(count: int) -> str:
    """ "1 row", "500 rows": for the log lines about batch sizes."""
    return f"{count} row" if count == 1 else f"{count} rows"


def halved(before: int, after: int) -> str:
    """The log line of a batch the database cancelled and the size it halved to."""
    return (
        f"a purge batch of {rows(before)} was cancelled by the database (statement_timeout?); "
        f"purging {rows(after)} at a time from now on"
    )

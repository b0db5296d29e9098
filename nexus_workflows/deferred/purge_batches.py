"""How many rows the next purge batch deletes; pure bookkeeping, no I/O.

A batch the database cancels (``QueryCanceled``, SQLSTATE 57014: its ``statement_timeout``,
or ``pg_cancel_backend``; both look alike and are treated alike) was too large for the time
it allows one statement, on this table as it is now. The size halves, to a floor of one row,
and the purge carries on with smaller batches instead of retrying the one that cannot pass.

It grows back, doubling up to ``PURGE_BATCH_SIZE``, only after :data:`GROW_AFTER` full
batches in a row each took under a quarter of the longest a cancelled batch ran (the
timeout, as far as the runner can tell without asking): a batch twice as large should then
take under half of it. Without that guard a persistent timeout would cancel a batch every
few turns. A partial batch (the last of a purge) says nothing about a full one and is not
counted either way.
"""

from __future__ import annotations

#: Full batches in a row, each quick enough, before the size doubles again.
GROW_AFTER = 3
#: A batch counts as quick when it took under 1/QUICK_FRACTION of a cancelled batch's time.
QUICK_FRACTION = 4


class PurgeBatchSize:
    """The purge's batch size; :meth:`cancelled` and :meth:`completed` report each batch."""

    def __init__(self, maximum: int) -> None:
        self.maximum = max(1, maximum)
        self.size = self.maximum
        # The longest a cancelled batch ran before the database cancelled it (seconds).
        self.cancelled_after: float | None = None
        self._quick_in_a_row = 0

    def cancelled(self, seconds: float) -> bool:
        """A batch of ``size`` rows was cancelled after ``seconds``; whether the size
        shrank (not when it was one row already)."""
        self.cancelled_after = max(self.cancelled_after or 0.0, seconds)
        self._quick_in_a_row = 0
        if self.size == 1:
            return False
        self.size = max(1, self.size // 2)
        return True

    def completed(self, deleted: int, seconds: float) -> bool:
        """A batch of ``size`` rows deleted ``deleted`` in ``seconds``; whether the size grew."""
        if deleted < self.size or self.size >= self.maximum:
            return False
        if not self._quick(seconds):
            self._quick_in_a_row = 0
            return False
        self._quick_in_a_row += 1
        if self._quick_in_a_row < GROW_AFTER:
            return False
        self._quick_in_a_row = 0
        self.size = min(self.maximum, self.size * 2)
        return True

    def _quick(self, seconds: float) -> bool:
        return self.cancelled_after is not None and seconds * QUICK_FRACTION < self.cancelled_after


def rows(count: int) -> str:
    """"1 row", "500 rows": for the log lines about batch sizes."""
    return f"{count} row" if count == 1 else f"{count} rows"


def halved(before: int, after: int) -> str:
    """The log line of a batch the database cancelled and the size it halved to."""
    return (
        f"a purge batch of {rows(before)} was cancelled by the database (statement_timeout?); "
        f"purging {rows(after)} at a time from now on"
    )

"""The runner's purge of expired rows: one batch per loop turn while rows remain, each
sized to take about ``PURGE_BATCH_SECONDS`` and no more than the database lets one
statement take (:class:`.purge_batches.PurgeBatchSize`): claims wait while a batch runs."""

from __future__ import annotations

import logging

from django.db import OperationalError

from nexus_workflows.conf import app_settings
from nexus_workflows.database_errors import transaction_conflict
from nexus_workflows.deferred import retention
from nexus_workflows.deferred.purge_batches import PurgeBatchSize, halved, rows
from nexus_workflows.deferred.runner.stats import RunStats

logger = logging.getLogger("nexus_workflows.deferred.runner")


class Purging:
    """Purges batch by batch. Neither a batch the database cancels (``statement_timeout``)
    nor one that meets another transaction (``lock_timeout``, a deadlock, a serialization
    failure) is an outage: the runner says so once and carries on claiming. A cancelled
    batch halves the size and the smaller one goes at the next turn; one row cancelled
    waits for the next sweep. A conflict is tried again at the next turn, then at each
    sweep while it keeps failing (a lock held for long must not hold up every turn).

    Each batch waits for a lock at most ``PURGE_BATCH_SECONDS`` (the time the claims may
    wait for one batch), or less where the session's ``lock_timeout`` is lower: without a
    bound of its own, a lock held for long (an admin's ``select_for_update()``, a session
    idle in its transaction) would hold up the claims as long, on a role with none.

    A batch that deletes nothing prunes unused rate-window rows (waiting for a lock as
    long); a prune that meets another transaction, or that the database cancels
    (``statement_timeout``), is said once, then quietly (DEBUG) at each purge while it
    keeps failing, as a batch's conflict is."""

    def __init__(self, using: str, stats: RunStats) -> None:
        self.using = using
        self.stats = stats
        self.sizes = PurgeBatchSize(
            int(app_settings.PURGE_BATCH_SIZE), float(app_settings.PURGE_BATCH_SECONDS)
        )
        # A batch of one row was cancelled and the runner said so: quiet until one passes.
        self._stuck_said = False
        # Batches in a row that met another transaction: said once, quiet until one passes.
        self._conflicts = 0
        # Prunes in a row that met another transaction: the same.
        self._prune_conflicts = 0

    def batch(self) -> bool:
        """Purge one batch; whether another is due at once (it was full, or it was
        cancelled and a smaller one may pass, or it met another transaction the first time)."""
        size = self.sizes.size
        try:
            deleted = retention.purge_sized_batch(
                self.sizes, using=self.using, lock_wait=self.sizes.target, prune=False
            )
        except OperationalError as error:
            conflict = transaction_conflict(error)
            if conflict is None:
                raise  # the database is unavailable: the runner's outage path
            return self._met_another_transaction(conflict)
        if deleted is None:
            return self._cancelled(size)
        self._passed()
        if not deleted:
            self._prune()
        self.stats.purged += deleted
        self._log_resize(size, deleted)
        return deleted >= size

    def _passed(self) -> None:
        self._stuck_said = False
        self._conflicts = 0

    def _log_resize(self, size: int, deleted: int) -> None:
        now = self.sizes.size
        if now > size and self.sizes.was_cancelled:
            logger.info("purge batches completed quickly; purging %s at a time again", rows(now))
        elif now != size:
            logger.debug(
                "a purge batch of %s took %s %gs; purging %s at a time",
                rows(deleted),
                "over" if now < size else "well under",
                self.sizes.budget,
                rows(now),
            )

    def _cancelled(self, size: int) -> bool:
        if self.sizes.size < size:
            logger.warning(halved(size, self.sizes.size))
            return True
        if not self._stuck_said:
            self._stuck_said = True
            logger.warning(
                "a purge batch of 1 row was cancelled by the database (statement_timeout?); "
                "trying again at the next sweep, in %gs (SWEEP_INTERVAL)",
                float(app_settings.SWEEP_INTERVAL),
            )
        else:
            logger.debug("a purge batch of 1 row was cancelled again; trying at the next sweep")
        return False

    def _met_another_transaction(self, conflict: str) -> bool:
        self._conflicts += 1
        if self._conflicts == 1:
            logger.warning(
                "a purge batch did not pass (%s); not an outage: trying again at the next turn, "
                "then at each sweep (SWEEP_INTERVAL) while it fails",
                conflict,
            )
            return True
        logger.debug("a purge batch did not pass again (%s); trying at the next sweep", conflict)
        return False

    def _prune(self) -> None:
        setback = retention.prune_rate_windows(self.using, self.sizes.target)
        if setback is None:
            self._prune_conflicts = 0  # passed: quiet, as a batch
        else:
            self._prune_did_not_pass(setback)

    def _prune_did_not_pass(self, setback: str) -> None:
        # A held lock or a cancel (a table too big for statement_timeout) lasts: said once.
        self._prune_conflicts += 1
        if self._prune_conflicts == 1:
            logger.warning(
                "pruning unused rate-window rows did not pass (%s); not an outage: trying again "
                "at each purge (SWEEP_INTERVAL) while it fails",
                setback,
            )
        else:
            logger.debug("pruning unused rate-window rows did not pass again (%s)", setback)

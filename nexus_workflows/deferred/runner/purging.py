"""The runner's purge of expired rows: one batch per loop turn while rows remain, sized to
what the database lets one statement take (:class:`.purge_batches.PurgeBatchSize`)."""

from __future__ import annotations

import logging

from nexus_workflows.conf import app_settings
from nexus_workflows.deferred import retention
from nexus_workflows.deferred.purge_batches import PurgeBatchSize, halved, rows
from nexus_workflows.deferred.runner.stats import RunStats

logger = logging.getLogger("nexus_workflows.deferred.runner")


class Purging:
    """Purges batch by batch. A batch the database cancels (``statement_timeout``) is no
    outage: the size halves, the runner says so once, and the smaller batch goes at the
    next turn. One row cancelled waits for the next sweep."""

    def __init__(self, using: str, stats: RunStats) -> None:
        self.using = using
        self.stats = stats
        self.sizes = PurgeBatchSize(int(app_settings.PURGE_BATCH_SIZE))
        # A batch of one row was cancelled and the runner said so: quiet until one passes.
        self._stuck_said = False

    def batch(self) -> bool:
        """Purge one batch; whether another is due at once (it was full, or it was
        cancelled and a smaller one may pass)."""
        size = self.sizes.size
        deleted = retention.purge_sized_batch(self.sizes, using=self.using)
        if deleted is None:
            return self._cancelled(size)
        self._stuck_said = False
        self.stats.purged += deleted
        if self.sizes.size > size:
            logger.info("purge batches completed quickly; purging %s at a time again", rows(self.sizes.size))
        return deleted >= size

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

"""Purging finished work once ``RETENTION`` has passed.

Only done and abandoned rows are purged, ``RETENTION`` seconds after their last update;
pending and processing rows are never purged, however long an outage lasts. The dedupe
horizon is therefore the retention: until a finished row is purged, enqueueing its key
again does nothing (done) or revives it (abandoned).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import router

from nexus_workflows.clock import now_plus
from nexus_workflows.conf import app_settings
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.transitions import purge
from nexus_workflows.flow import windows
from nexus_workflows.flow.claiming import window_name
from nexus_workflows.models import DeferredWork


def expiry_cutoff(now: datetime | None = None) -> Any:
    """Rows last updated before this are expired: by the database's clock, unless
    ``now`` is given."""
    retention = timedelta(seconds=app_settings.RETENTION)
    return now - retention if now is not None else now_plus(-retention)


def rate_periods() -> dict[str, float]:
    """The period of each registered workflow's rate window, by window name (the periods
    of ``rate_limited`` windows are known only to their callers)."""
    return {
        window_name(workflow.kind): workflow.flow.rate_limit[1]
        for workflow in registry
        if workflow.is_deferred and workflow.flow is not None and workflow.flow.rate_limit is not None
    }


def purge_batch(
    *, now: datetime | None = None, batch_size: int | None = None, using: str | None = None
) -> int:
    """Delete at most one batch of expired rows; returns how many were deleted.

    Deleting by primary key in bounded batches keeps every statement short, so a large
    backlog never holds locks or blocks a runner for long. The ``DELETE`` itself re-checks
    status and expiry, so a row revived (or otherwise changed) after the ids were read is
    left alone. It is one statement, never Django's collector: that one deletes by primary
    key only (whenever any ``pre_delete``/``post_delete`` receiver is connected), so no
    delete signals are sent for purged rows, as ``QuerySet.update()`` sends no save signals.
    """
    using = using or router.db_for_write(DeferredWork)
    batch_size = batch_size or app_settings.PURGE_BATCH_SIZE
    expired = DeferredWork.objects.using(using).expired(expiry_cutoff(now))
    ids = list(expired.values_list("pk", flat=True)[:batch_size])
    if not ids:
        # Nothing expired left: also drop rate-window rows unused for an hour (windows of
        # keys that came and went) that no longer count under their window's period.
        windows.prune(using=using, periods=rate_periods())
        return 0
    return purge(expired, ids)


def purge_expired(*, now: datetime | None = None, using: str | None = None) -> int:
    """Delete every expired row, batch by batch; returns how many were deleted."""
    total = 0
    batch_size = app_settings.PURGE_BATCH_SIZE
    while True:
        deleted = purge_batch(now=now, batch_size=batch_size, using=using)
        total += deleted
        if deleted < batch_size:
            return total

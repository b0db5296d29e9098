"""The host's clock as the database keeps time, for "written at or after this" checks and
for rows made due now."""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.utils import timezone

from nexus_workflows.models import DeferredWork


def database_resolution_now() -> datetime:
    """``timezone.now()`` truncated to what the database's clock resolves: SQLite keeps
    milliseconds (see ``nexus_workflows.clock.due_after``), so a stamp written after this
    call may still read a few hundred microseconds earlier than the host's time, and a row
    due at the host's microseconds may not be due yet by the database's clock."""
    now = timezone.now()
    if connection.vendor == "sqlite":
        return now.replace(microsecond=now.microsecond // 1000 * 1000)
    return now


def make_due(work_id: str | int | None) -> None:
    """Make the row ``work_id`` due now, as ``enqueue`` would (a claim in the same
    millisecond takes it on SQLite too)."""
    assert work_id is not None
    DeferredWork.objects.filter(pk=int(work_id)).update(next_attempt_at=database_resolution_now())

"""The host's clock as the database keeps time, for "written at or after this" checks."""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.utils import timezone


def database_resolution_now() -> datetime:
    """``timezone.now()`` truncated to what the database's clock resolves: SQLite keeps
    milliseconds (see ``nexus_workflows.clock``), so a stamp written after this call
    may still read a few hundred microseconds earlier than the host's time."""
    now = timezone.now()
    if connection.vendor == "sqlite":
        return now.replace(microsecond=now.microsecond // 1000 * 1000)
    return now

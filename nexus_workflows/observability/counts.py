"""Per-minute outcome counts: added once per batch of outcomes, read by the dashboard.

A runner collects the outcomes it wrote in memory and adds them with one statement per
batch (``INSERT … ON CONFLICT DO UPDATE SET count = count + excluded.count``), in the
minute of the database's clock. When that statement fails (the database went away) the
counts stay in memory and go with the next batch, so nothing is counted twice or lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from .models import OutcomeCount

#: Counts older than this are purged: the dashboard shows the last 24 hours.
KEEP = timedelta(hours=25)

Counts = Mapping[tuple[str, str], int]  # (kind, outcome) -> attempts


def add(counts: Counts, *, using: str) -> None:
    """Add ``counts`` to the current minute's rows: one statement on PostgreSQL and SQLite."""
    items = [(kind, outcome, n) for (kind, outcome), n in counts.items() if n]
    if not items:
        return
    connection = connections[using]
    table = connection.ops.quote_name(OutcomeCount._meta.db_table)
    conflict = f"ON CONFLICT (minute, kind, outcome) DO UPDATE SET count = {table}.count + excluded.count"
    if connection.vendor == "postgresql":
        sql = (
            f"INSERT INTO {table} (minute, kind, outcome, count) "
            "SELECT date_trunc('minute', statement_timestamp()), k, o, c "
            "FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS v(k, o, c) " + conflict
        )
        kinds, outcomes, numbers = zip(*items, strict=True)
        params: list = [list(kinds), list(outcomes), list(numbers)]
    elif connection.vendor == "sqlite":
        minute = "strftime('%%Y-%%m-%%d %%H:%%M:00', 'now')"
        values = ", ".join(f"({minute}, %s, %s, %s)" for _ in items)
        sql = f"INSERT INTO {table} (minute, kind, outcome, count) VALUES {values} {conflict}"
        params = [value for item in items for value in item]
    else:
        _add_portably(items, using)
        return
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, params)


def _add_portably(items: list[tuple[str, str, int]], using: str) -> None:
    # Other backends: the ORM, in this process's minute.
    minute = timezone.now().replace(second=0, microsecond=0)
    with transaction.atomic(using=using):
        for kind, outcome, n in items:
            rows = OutcomeCount.objects.using(using).filter(minute=minute, kind=kind, outcome=outcome)
            if not rows.update(count=F("count") + n):
                OutcomeCount.objects.using(using).create(minute=minute, kind=kind, outcome=outcome, count=n)


def purge(now: datetime, *, using: str) -> int:
    deleted, _ = OutcomeCount.objects.using(using).filter(minute__lt=now - KEEP).delete()
    return deleted

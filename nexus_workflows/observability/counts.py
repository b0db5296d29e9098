"""Per-minute outcome counts: added by the runners, read by the dashboard.

A runner collects the outcomes it wrote in memory and adds them with one statement per
batch of outcomes, at most one a second (``INSERT … ON CONFLICT DO UPDATE SET count =
count + excluded.count``), in the minute of the database's clock. Each batch carries a
token, written with the counts: when the statement fails (the database went away) the
runner sends the same batch with the same token again, and a batch that had in fact been
committed (only its answer was lost) is not added a second time. Nothing is lost, nothing
is counted twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from django.db import IntegrityError, connections, transaction
from django.db.models import F
from django.utils import timezone

from .models import OutcomeCount, OutcomeFlush

#: Counts older than this are purged: the dashboard shows the last 24 hours.
KEEP = timedelta(hours=25)

Counts = Mapping[tuple[str, str], int]  # (kind, outcome) -> attempts


def add(counts: Counts, *, token: str, using: str) -> bool:
    """Add ``counts`` to the current minute's rows, once per ``token``; returns whether
    they were added (``False``: this token's batch was added before).

    One statement on PostgreSQL (the token's row and the counts, by a data-modifying CTE),
    one transaction elsewhere, so a retry after a lost acknowledgement adds nothing twice.
    """
    items = [(kind, outcome, n) for (kind, outcome), n in counts.items() if n]
    if not items:
        return False
    connection = connections[using]
    table = connection.ops.quote_name(OutcomeCount._meta.db_table)
    flushes = connection.ops.quote_name(OutcomeFlush._meta.db_table)
    conflict = f"ON CONFLICT (minute, kind, outcome) DO UPDATE SET count = {table}.count + excluded.count"
    if connection.vendor == "postgresql":
        sql = (
            f"WITH batch AS (INSERT INTO {flushes} (token, at) VALUES (%s, statement_timestamp()) "
            "ON CONFLICT DO NOTHING RETURNING token) "
            f"INSERT INTO {table} (minute, kind, outcome, count) "
            "SELECT date_trunc('minute', statement_timestamp()), k, o, c "
            "FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS v(k, o, c) "
            "WHERE EXISTS (SELECT 1 FROM batch) " + conflict
        )
        kinds, outcomes, numbers = zip(*items, strict=True)
        with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
            cursor.execute(sql, [token, list(kinds), list(outcomes), list(numbers)])
            return cursor.rowcount > 0
    if connection.vendor == "sqlite":
        minute = "strftime('%%Y-%%m-%%d %%H:%%M:00', 'now')"
        values = ", ".join(f"({minute}, %s, %s, %s)" for _ in items)
        with transaction.atomic(using=using), connection.cursor() as cursor:
            cursor.execute(
                f"INSERT OR IGNORE INTO {flushes} (token, at) "
                "VALUES (%s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))",
                [token],
            )
            if cursor.rowcount != 1:
                return False
            cursor.execute(
                f"INSERT INTO {table} (minute, kind, outcome, count) VALUES {values} {conflict}",
                [value for item in items for value in item],
            )
        return True
    return _add_portably(items, token, using)


def _add_portably(items: list[tuple[str, str, int]], token: str, using: str) -> bool:
    # Other backends: the ORM, in this process's minute.
    now = timezone.now()
    minute = now.replace(second=0, microsecond=0)
    with transaction.atomic(using=using):
        try:
            with transaction.atomic(using=using):
                OutcomeFlush.objects.using(using).create(token=token, at=now)
        except IntegrityError:
            return False
        for kind, outcome, n in items:
            rows = OutcomeCount.objects.using(using).filter(minute=minute, kind=kind, outcome=outcome)
            if not rows.update(count=F("count") + n):
                OutcomeCount.objects.using(using).create(minute=minute, kind=kind, outcome=outcome, count=n)
    return True


def purge(now: datetime, *, using: str) -> int:
    OutcomeFlush.objects.using(using).filter(at__lt=now - KEEP).delete()
    deleted, _ = OutcomeCount.objects.using(using).filter(minute__lt=now - KEEP).delete()
    return deleted

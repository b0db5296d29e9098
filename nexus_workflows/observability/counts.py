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

from django.db import IntegrityError, transaction
from django.db.models import F

from nexus_workflows import sql
from nexus_workflows.clock import database_now
from nexus_workflows.observability.models import OutcomeCount, OutcomeFlush

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
    statements = sql.for_connection(using)
    if hasattr(statements, "add_outcome_counts"):
        return statements.add_outcome_counts(using, token, items)
    return _add_portably(items, token, using)


def _add_portably(items: list[tuple[str, str, int]], token: str, using: str) -> bool:
    # Other backends: the ORM, in the database's minute (the dashboard's buckets are the
    # database's time: a host whose clock is off must not file counts in another minute).
    now = database_now(using)
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

"""The ``Runner`` rows: which ``runworkflows`` processes are alive, seen from the database."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db.models import BooleanField, Case, ExpressionWrapper, F, Q, QuerySet, When

from nexus_workflows import sql
from nexus_workflows.clock import DatabaseNow
from nexus_workflows.conf import app_settings
from nexus_workflows.database_errors import rerun_if_ended_idle
from nexus_workflows.observability.models import Runner


def version() -> str:
    from nexus_workflows import __version__

    return __version__


def stale_after() -> timedelta:
    return timedelta(seconds=float(app_settings.STALE_AFTER))


def alive_q() -> Q:
    """Runners seen within ``STALE_AFTER`` by the database's clock."""
    return Q(last_seen_at__gte=DatabaseNow() - stale_after())


def with_liveness(queryset: QuerySet[Runner]) -> QuerySet[Runner]:
    return queryset.annotate(alive=ExpressionWrapper(alive_q(), output_field=BooleanField()))


def count_alive(using: str | None = None) -> tuple[int, int]:
    """(alive, dead) runner rows."""
    rows = Runner.objects.using(using) if using else Runner.objects.all()
    total = rows.count()
    alive = rows.filter(alive_q()).count() if total else 0
    return alive, total - alive


def register(*, kinds: Sequence[str], concurrency: int, using: str, wakeup_mode: str = "poll") -> int:
    row = Runner.objects.using(using).create(
        wakeup_mode=wakeup_mode,
        wakeup_mode_since=DatabaseNow(),
        host=socket.gethostname()[:255],
        pid=os.getpid(),
        version=version(),
        kinds=list(kinds),
        concurrency=concurrency,
        started_at=DatabaseNow(),
        last_seen_at=DatabaseNow(),
    )
    return row.pk


def refresh(pk: int, *, in_flight: int, done: int, failed: int, wakeup_mode: str, using: str) -> bool:
    """Mark the runner seen now; ``False`` when its row is gone (purged while it was away)."""
    return bool(
        Runner.objects.using(using)
        .filter(pk=pk)
        .update(
            last_seen_at=DatabaseNow(),
            in_flight=in_flight,
            done=done,
            failed=failed,
            wakeup_mode=wakeup_mode,
            wakeup_mode_since=Case(
                When(wakeup_mode=wakeup_mode, then=F("wakeup_mode_since")), default=DatabaseNow()
            ),
        )
    )


def remove(pk: int, *, using: str, lock_wait: float) -> None:
    """Delete a stopping runner's row, waiting at most ``lock_wait`` seconds for a lock on
    it (one held must not hang the runner's exit), as the refreshes do; on a new session
    when the server ended this one for sitting idle (a stop may follow a long wait)."""

    def delete() -> None:
        with sql.for_connection(using).lock_waits_at_most(using, lock_wait):
            Runner.objects.using(using).filter(pk=pk).delete()

    rerun_if_ended_idle(using, delete)


def purge_dead(now: datetime, *, using: str) -> int:
    """Delete rows of runners not seen for ``RETENTION`` (long after they were shown dead)."""
    cutoff = now - max(timedelta(seconds=float(app_settings.RETENTION)), stale_after())
    deleted, _ = Runner.objects.using(using).filter(last_seen_at__lt=cutoff).delete()
    return deleted

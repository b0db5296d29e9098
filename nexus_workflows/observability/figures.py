"""What the database says about deferred work right now, cheaply enough to ask on every
scrape: rows per kind and status, how many processing rows of each kind lost their runner
(stale claims), and how late the most overdue item of each kind is.

Each status is counted by its own query so that each uses its index: pending and
processing rows through the partial indexes ``nw_due_idx`` and ``nw_stale_idx`` (whose size
is the backlog, not the retained history), abandoned rows through ``nw_expiry_idx``.
Done rows are not counted: they are most of a retained table (a million rows is a day
of a busy platform), and counting them would read all of them on every scrape; the
runners' ``nexus_workflows_attempts_total{outcome="done"}`` counts them as they happen.

A stale claim (a processing row whose heartbeat is older than ``STALE_AFTER``, or that has
none, :func:`.triage.stale_q`, as the triage desk counts them) is overdue too: its runner
died or lost the database (or another session has held a lock on its row that long), and
until a live runner of its kind takes it over nothing runs it; one with no heartbeat at
all (written by hand) waits for an operator. It counts as due from the moment it went
stale (its heartbeat plus ``STALE_AFTER``; with none, its last update), so the oldest due
age grows for work a dead runner holds as for work nobody claims (it read 0, "nothing
overdue", while a killed runner's attempts were run by no one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Min, Q, QuerySet

from nexus_workflows.conf import app_settings
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.triage import stale_q
from nexus_workflows.deferred.unknown_kinds import unknown_of
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.observability.clock import database_now

#: Statuses reported as ``nexus_workflows_work{status}`` (see the module's docstring).
COUNTED_STATUSES = (Status.PENDING, Status.PROCESSING, Status.ABANDONED)


@dataclass
class WorkFigures:
    now: datetime
    counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, status) -> rows
    #: kind -> the earliest due time: of a due pending row, or when a stale claim went stale.
    oldest_due: dict[str, datetime] = field(default_factory=dict)
    #: Stale claims per kind: processing rows whose heartbeat is older than STALE_AFTER, or
    #: that have none (see the module's docstring).
    stale: dict[str, int] = field(default_factory=dict)
    #: Due rows per kind that no runner of this project runs (they stay pending).
    due_unknown: dict[str, int] = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        """Every deferred kind this project registers, plus any kind found in the table."""
        found = {kind for kind, _ in self.counts} | set(self.oldest_due) | set(self.stale)
        return sorted(found | set(registry.kinds(deferred=True)))

    def count(self, kind: str, status: str) -> int:
        return self.counts.get((kind, status), 0)

    def due_since(self, kind: str, when: datetime) -> None:
        if kind not in self.oldest_due or when < self.oldest_due[kind]:
            self.oldest_due[kind] = when

    def oldest_due_age(self, kind: str) -> float:
        """Seconds the most overdue item of ``kind`` has waited: a due pending item past its
        due time, or a stale claim since it went stale."""
        due = self.oldest_due.get(kind)
        return max(0.0, (self.now - due).total_seconds()) if due else 0.0


def work_figures(using: str) -> WorkFigures:
    figures = WorkFigures(now=database_now(using))
    rows = DeferredWork.objects.using(using)
    for status in COUNTED_STATUSES:
        for kind, n in rows.filter(status=status).order_by().values_list("kind").annotate(n=Count("pk")):
            figures.counts[(kind, status.value)] = n
    # One read of the due rows gives both how late each kind is and how many no runner knows.
    due = rows.due(figures.now).order_by().values_list("kind", "backend_name")
    groups = list(due.annotate(oldest=Min("next_attempt_at"), n=Count("pk")))
    for kind, _backend, oldest, _n in groups:
        figures.due_since(kind, oldest)
    figures.due_unknown = unknown_of((kind, backend, n) for kind, backend, _oldest, n in groups)
    _count_stale_claims(figures, rows)
    return figures


def _count_stale_claims(figures: WorkFigures, rows: QuerySet[DeferredWork]) -> None:
    """Stale claims per kind, each due since it went stale (:func:`stale_since`).
    Processing rows are few (``nw_stale_idx``), so this costs a scrape little."""
    stale = rows.filter(stale_q(figures.now)).order_by().values_list("kind")
    unbeaten = Min("updated_at", filter=Q(heartbeat_at__isnull=True))
    for kind, n, beat, update in stale.annotate(n=Count("pk"), beat=Min("heartbeat_at"), update=unbeaten):
        figures.stale[kind] = n
        if beat is not None:
            figures.due_since(kind, stale_since(beat, updated_at=None))
        if update is not None:
            figures.due_since(kind, stale_since(None, updated_at=update))


def stale_since(heartbeat_at: datetime | None, *, updated_at: datetime | None) -> datetime:
    """When a stale claim went stale: its heartbeat plus ``STALE_AFTER``; a row with no
    heartbeat at all (written by hand: no runner takes it over), at its last update."""
    if heartbeat_at is not None:
        return heartbeat_at + timedelta(seconds=app_settings.STALE_AFTER)
    assert updated_at is not None  # a row's updated_at is never NULL
    return updated_at


def task_paths(using: str, queues: Sequence[str] | None) -> list[str]:
    """Django task paths (a task's kind) with rows of a counted status on ``queues`` (None:
    every queue), which a runner of those queues may claim: the kinds of
    ``nexus_workflows_work`` that are tasks, no more. One query per status, as above."""
    if queues is not None and not queues:
        return []
    rows = DeferredWork.objects.using(using).exclude(backend_name="")
    if queues is not None:
        rows = rows.filter(queue_name__in=list(queues))
    found: set[str] = set()
    for status in COUNTED_STATUSES:
        found.update(rows.filter(status=status).order_by().values_list("kind", flat=True).distinct())
    return sorted(found)

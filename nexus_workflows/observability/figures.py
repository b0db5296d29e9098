"""What the database says about deferred work right now, cheaply enough to ask on every
scrape: rows per kind and status, and how late the most overdue pending item of each kind is.

Each status is counted by its own query so that each uses its index: pending and
processing rows through the partial indexes ``nw_due_idx`` and ``nw_stale_idx`` (whose size
is the backlog, not the retained history), abandoned rows through ``nw_expiry_idx``.
Done rows are not counted: they are most of a retained table (a million rows is a day
of a busy platform), and counting them would read all of them on every scrape; the
runners' ``nexus_workflows_attempts_total{outcome="done"}`` counts them as they happen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, Min

from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.unknown_kinds import unknown_of
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.observability.clock import database_now

#: Statuses reported as ``nexus_workflows_work{status}`` (see the module's docstring).
COUNTED_STATUSES = (Status.PENDING, Status.PROCESSING, Status.ABANDONED)


@dataclass
class WorkFigures:
    now: datetime
    counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, status) -> rows
    oldest_due: dict[str, datetime] = field(default_factory=dict)  # kind -> earliest due time
    #: Due rows per kind that no runner of this project runs (they stay pending).
    due_unknown: dict[str, int] = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        """Every deferred kind this project registers, plus any kind found in the table."""
        found = {kind for kind, _ in self.counts} | set(self.oldest_due)
        return sorted(found | set(registry.kinds(deferred=True)))

    def count(self, kind: str, status: str) -> int:
        return self.counts.get((kind, status), 0)

    def oldest_due_age(self, kind: str) -> float:
        """Seconds the most overdue pending item of ``kind`` has waited past its due time."""
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
        if kind not in figures.oldest_due or oldest < figures.oldest_due[kind]:
            figures.oldest_due[kind] = oldest
    figures.due_unknown = unknown_of((kind, backend, n) for kind, backend, _oldest, n in groups)
    return figures


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

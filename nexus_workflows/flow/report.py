"""What flow control is doing now: for ``workflows status``, the admin and metrics.

A due item of a limited kind that cannot start waits for exactly one reason, the first
that holds of:

1. **key** — its serial key is busy: an item of its key is processing, or an
   earlier-enqueued item of its key is ready (``ordered``: pending at all, or processing);
2. **slot** — the kind's ``concurrency`` slots are all held;
3. **rate** — its rate window (the kind's, or its rate key's) has had ``limit`` starts in
   the last ``period`` seconds.

Counts are read on the database's clock and are a snapshot: runners change them
continuously.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import router
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce

from nexus_workflows.clock import DatabaseNow
from nexus_workflows.deferred.registry import Workflow, registry
from nexus_workflows.flow import windows
from nexus_workflows.flow.claiming import busy_starts_subquery, key_conditions, window_name
from nexus_workflows.flow.options import FlowLimits
from nexus_workflows.models import DeferredWork, Status

REASONS = ("key", "slot", "rate")


@dataclass
class KindFlow:
    kind: str
    limits: str
    concurrency: int | None
    slots_in_use: int  # processing attempts of the kind (the slots they hold, if capped)
    waiting: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))


def limited_workflows() -> list[Workflow]:
    return [workflow for workflow in registry if workflow.is_deferred and workflow.flow is not None]


def _due(kind: str, using: str) -> Any:
    return DeferredWork.objects.using(using).filter(
        kind=kind, status=Status.PENDING, next_attempt_at__lte=DatabaseNow()
    )


def _with_busy_window(queryset: Any, kind: str, flow: FlowLimits) -> Any:
    return queryset.annotate(window_key=Coalesce(F("rate_key_hash"), Value(""))).annotate(
        busy=busy_starts_subquery(kind, flow)
    )


def kind_flow(workflow: Workflow, *, using: str | None = None) -> KindFlow:
    flow = workflow.flow
    assert flow is not None
    using = using or router.db_for_read(DeferredWork)
    running = DeferredWork.objects.using(using).filter(kind=workflow.kind, status=Status.PROCESSING).count()
    report = KindFlow(workflow.kind, flow.describe(), flow.concurrency, running)
    due = _due(workflow.kind, using)
    total = due.count()
    if not total:
        return report
    key_free = due.filter(key_conditions(workflow.kind, flow, DatabaseNow())) if flow.keyed else due
    free_count = key_free.count() if flow.keyed else total
    report.waiting["key"] = total - free_count
    startable = free_count
    if flow.concurrency is not None:
        room = max(0, flow.concurrency - running)
        report.waiting["slot"] = max(0, startable - room)
        startable -= report.waiting["slot"]
    if flow.rate_limit is not None and startable:
        limit, period = flow.rate_limit
        if flow.rate_key is None:
            busy = windows.busy_count(window_name(workflow.kind), "", limit, period, using=using)
            room = max(0, limit - busy)  # a lowered limit's starts may exceed it
            report.waiting["rate"] = max(0, startable - room)
        else:
            full = _with_busy_window(key_free, workflow.kind, flow).filter(busy__gte=limit).count()
            report.waiting["rate"] = min(full, startable)
    return report


def flow_report(*, using: str | None = None) -> list[KindFlow]:
    """One :class:`KindFlow` per registered kind with limits, by kind."""
    return [
        kind_flow(workflow, using=using) for workflow in sorted(limited_workflows(), key=lambda w: w.kind)
    ]


def flow_metrics(*, using: str | None = None) -> dict[str, dict[str, int]]:
    """For a metrics collector: per limited kind, ``slots_in_use`` and ``waiting_key``,
    ``waiting_slot``, ``waiting_rate`` (labels are kinds only: no key ever leaves)."""
    return {
        item.kind: {
            "slots_in_use": item.slots_in_use,
            **{f"waiting_{reason}": n for reason, n in item.waiting.items()},
        }
        for item in flow_report(using=using)
    }


def waiting_reason(work: DeferredWork) -> str | None:
    """Which limit holds back one pending, due item, in words (no key values); ``None``
    when nothing does (or the item is not due, or its kind has no limits)."""
    if work.kind not in registry:
        return None
    workflow = registry.get(work.kind)
    flow = workflow.flow
    if flow is None or work.status != Status.PENDING:
        return None
    using = work._state.db or router.db_for_read(DeferredWork)
    this = _due(work.kind, using).filter(pk=work.pk)
    if not this.exists():
        return None
    if flow.keyed and not this.filter(key_conditions(work.kind, flow, DatabaseNow())).exists():
        if flow.ordered:
            return (
                "its serial key: an earlier item of the same key is pending, waiting for a retry or running"
            )
        return "its serial key: another item of the same key is running or was enqueued earlier"
    if flow.concurrency is not None:
        running = DeferredWork.objects.using(using).filter(kind=work.kind, status=Status.PROCESSING).count()
        if running >= flow.concurrency:
            return f"concurrency: all {flow.concurrency} slots of {work.kind} are in use"
    if flow.rate_limit is not None:
        limit, period = flow.rate_limit
        if _with_busy_window(this, workflow.kind, flow).filter(busy__gte=limit).exists():
            scope = "its rate key's" if flow.rate_key else f"{work.kind}'s"
            return f"rate limit: {scope} window has had {limit} starts in the last {period:g}s"
    return None


def waiting_on_limit_q(*, using: str | None = None) -> Q:
    """Rows that are due but held back by a limit, for the admin's list filter."""
    using = using or router.db_for_read(DeferredWork)
    held = Q(pk__in=[])
    for workflow in limited_workflows():
        flow = workflow.flow
        assert flow is not None
        due = _due(workflow.kind, using)
        running = (
            DeferredWork.objects.using(using).filter(kind=workflow.kind, status=Status.PROCESSING).count()
        )
        if flow.concurrency is not None and running >= flow.concurrency:
            held |= Q(pk__in=due.values("pk"))
            continue
        if flow.keyed:
            held |= Q(pk__in=due.exclude(key_conditions(workflow.kind, flow, DatabaseNow())).values("pk"))
        if flow.rate_limit is not None:
            limit, _ = flow.rate_limit
            held |= Q(pk__in=_with_busy_window(due, workflow.kind, flow).filter(busy__gte=limit).values("pk"))
    return held

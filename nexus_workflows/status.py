"""What ``manage.py workflows status`` reports: counts, the oldest due item, abandoned work.

Dedupe keys and error messages may carry patient data: the report names work by kind and
id and errors by exception type, unless it is rendered with ``reveal=True``
(``workflows status --reveal``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count
from django.utils import timezone

from .history import first_line
from .models import DeferredWork, Status
from .redaction import error_type


@dataclass
class StatusReport:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    oldest_due: DeferredWork | None = None
    abandoned: list[DeferredWork] = field(default_factory=list)
    abandoned_total: int = 0
    generated_at: datetime = field(default_factory=timezone.now)


def build_status_report(*, abandoned_limit: int = 20) -> StatusReport:
    report = StatusReport()
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {status.value: 0 for status in Status})
    rows = DeferredWork.objects.values("kind", "status").annotate(n=Count("pk")).order_by("kind")
    for row in rows:
        counts[row["kind"]][row["status"]] = row["n"]
    report.counts = dict(counts)
    report.oldest_due = (
        DeferredWork.objects.due(report.generated_at)
        .order_by("next_attempt_at")
        .only("pk", "kind", "dedupe_key", "next_attempt_at", "attempt")
        .first()
    )
    abandoned = DeferredWork.objects.filter(status=Status.ABANDONED).order_by("-updated_at")
    report.abandoned_total = abandoned.count()
    report.abandoned = list(
        abandoned.only("pk", "kind", "dedupe_key", "attempt", "last_error", "updated_at")[:abandoned_limit]
    )
    return report


def render_status_report(report: StatusReport, *, reveal: bool = False) -> str:
    statuses = [status.value for status in Status]
    lines = []
    if not report.counts:
        lines.append("No deferred work in the database.")
    else:
        width = max(len("KIND"), *(len(kind) for kind in report.counts))
        lines.append("KIND".ljust(width) + "".join(s.upper().rjust(12) for s in statuses))
        for kind, by_status in sorted(report.counts.items()):
            lines.append(kind.ljust(width) + "".join(str(by_status[s]).rjust(12) for s in statuses))
    if report.oldest_due is not None:
        due = report.oldest_due
        late = (report.generated_at - due.next_attempt_at).total_seconds()
        lines.append(
            f"Oldest due: {due.kind} #{due.pk} (attempt {due.attempt}), due since "
            f"{due.next_attempt_at:%Y-%m-%d %H:%M:%S %Z} ({late:.0f}s ago)"
        )
    else:
        lines.append("Oldest due: nothing is due.")
    lines.append(f"Abandoned: {report.abandoned_total}")
    for work in report.abandoned:
        key = f" key={work.dedupe_key}" if reveal else ""
        error = first_line(work.last_error) if reveal else error_type(work.last_error)
        lines.append(
            f"  #{work.pk} {work.kind}{key} attempt {work.attempt} "
            f"updated {work.updated_at:%Y-%m-%d %H:%M:%S %Z}: {error}"
        )
    if report.abandoned_total > len(report.abandoned):
        lines.append(f"  … and {report.abandoned_total - len(report.abandoned)} more")
    return "\n".join(lines)

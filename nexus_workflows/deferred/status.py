"""What ``manage.py workflows status`` reports: counts, the oldest due item, stale claims
(processing rows whose heartbeat is older than ``STALE_AFTER``, or that have none),
abandoned work, and how each live runner learns of new work (its wake-up mode).

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

from nexus_workflows.clock import database_now
from nexus_workflows.deferred.attempts import describe_attempt
from nexus_workflows.deferred.history import first_line
from nexus_workflows.deferred.triage import stale_q
from nexus_workflows.deferred.unknown_kinds import due_of_unknown_kinds
from nexus_workflows.deferred.wakeup import WakeupMode
from nexus_workflows.flow.report import KindFlow, flow_report
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.observability import runners as live_runners
from nexus_workflows.observability.figures import stale_since
from nexus_workflows.observability.models import Runner
from nexus_workflows.redaction import error_type


@dataclass
class StatusReport:
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    oldest_due: DeferredWork | None = None
    abandoned: list[DeferredWork] = field(default_factory=list)
    abandoned_total: int = 0
    runners: list[Runner] = field(default_factory=list)
    #: The database's time of the report, which "due" and "ago" are judged by.
    generated_at: datetime = field(default_factory=timezone.now)
    flow: list[KindFlow] = field(default_factory=list)
    #: Due rows per kind that no runner of this project runs (they stay pending).
    unknown_due: dict[str, int] = field(default_factory=dict)
    #: Stale claims per kind, and the one whose runner was heard from longest ago.
    stale: dict[str, int] = field(default_factory=dict)
    oldest_stale: DeferredWork | None = None
    oldest_stale_since: datetime | None = None  # when it went stale (figures.stale_since)


def build_status_report(*, abandoned_limit: int = 20) -> StatusReport:
    # Due and overdue by the database's clock, never this host's (README "One clock").
    report = StatusReport(generated_at=database_now(DeferredWork.objects.db))
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {status.value: 0 for status in Status})
    rows = DeferredWork.objects.values("kind", "status").annotate(n=Count("pk")).order_by("kind")
    for row in rows:
        counts[row["kind"]][row["status"]] = row["n"]
    report.counts = dict(counts)
    report.oldest_due = (
        DeferredWork.objects.due(report.generated_at)
        .order_by("next_attempt_at")
        .only("pk", "kind", "dedupe_key", "next_attempt_at", "attempt", "backend_name")
        .first()
    )
    abandoned = DeferredWork.objects.filter(status=Status.ABANDONED).order_by("-updated_at")
    report.flow = flow_report()
    report.unknown_due = due_of_unknown_kinds(report.generated_at, using=DeferredWork.objects.db)
    _add_stale_claims(report)
    report.abandoned_total = abandoned.count()
    listed = ("pk", "kind", "dedupe_key", "attempt", "backend_name", "last_error", "updated_at")
    report.abandoned = list(abandoned.only(*listed)[:abandoned_limit])
    # Rows of runners that stopped without removing theirs are left out after STALE_AFTER,
    # on the database's clock like the rows' own times.
    report.runners = list(Runner.objects.filter(live_runners.alive_q()).order_by("host", "pid"))
    return report


def _add_stale_claims(report: StatusReport) -> None:
    stale = DeferredWork.objects.filter(stale_q(report.generated_at))
    report.stale = dict(stale.order_by("kind").values_list("kind").annotate(n=Count("pk")))
    if not report.stale:
        return
    # The one stale longest: of those with a heartbeat, the oldest beat; of those with
    # none (written by hand), the oldest update (figures.stale_since).
    fields = ("pk", "kind", "heartbeat_at", "updated_at", "attempt", "backend_name")
    firsts = [
        stale.filter(heartbeat_at__isnull=False).order_by("heartbeat_at", "pk").only(*fields).first(),
        stale.filter(heartbeat_at__isnull=True).order_by("updated_at", "pk").only(*fields).first(),
    ]
    found = [(stale_since(work.heartbeat_at, updated_at=work.updated_at), work) for work in firsts if work]
    report.oldest_stale_since, report.oldest_stale = min(found, key=lambda pair: pair[0])


_MODE_NOTES: dict[str, str] = {  # by WakeupMode, a StrEnum: the runner row's string finds it
    WakeupMode.LISTENING: "new work starts at once (LISTEN/NOTIFY, proven by a probe)",
    WakeupMode.SHORT_POLL: "wake-ups do not arrive: polling every WAKEUP_FALLBACK_POLL_INTERVAL; "
    "behind a pooler, set WAKEUP_DATABASE",
    WakeupMode.STARTING: "proving its wake-ups",
    WakeupMode.POLL: "polls every POLL_INTERVAL (no LISTEN: not PostgreSQL, WAKEUP off, or --once)",
}


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
    if report.oldest_stale_since is not None and (
        report.oldest_due is None or report.oldest_stale_since < report.oldest_due.next_attempt_at
    ):
        lines.append(f"Oldest due: {_stale_claim(report)}")  # as the metric's oldest due age counts it
    elif report.oldest_due is not None:
        due = report.oldest_due
        late = (report.generated_at - due.next_attempt_at).total_seconds()
        attempt = describe_attempt(due.kind, due.attempt, due.backend_name)
        lines.append(
            f"Oldest due: {due.kind} #{due.pk} ({attempt}), due since "
            f"{due.next_attempt_at:%Y-%m-%d %H:%M:%S %Z} ({late:.0f}s ago)"
        )
    else:
        lines.append("Oldest due: nothing is due.")
    lines.extend(render_stale(report))
    lines.extend(render_flow(report.flow))
    lines.extend(render_unknown(report.unknown_due))
    lines.append(f"Abandoned: {report.abandoned_total}")
    for work in report.abandoned:
        key = f" key={work.dedupe_key}" if reveal else ""
        error = first_line(work.last_error) if reveal else error_type(work.last_error)
        lines.append(
            f"  #{work.pk} {work.kind}{key} {describe_attempt(work.kind, work.attempt, work.backend_name)} "
            f"updated {work.updated_at:%Y-%m-%d %H:%M:%S %Z}: {error}"
        )
    if report.abandoned_total > len(report.abandoned):
        lines.append(f"  … and {report.abandoned_total - len(report.abandoned)} more")
    if report.runners:
        lines.append(f"Runners' wake-ups: {len(report.runners)}")
        for runner in report.runners:
            note = _MODE_NOTES.get(runner.wakeup_mode, "")
            lines.append(
                f"  {runner.host}:{runner.pid} {runner.wakeup_mode} since "
                f"{runner.wakeup_mode_since:%Y-%m-%d %H:%M:%S %Z}" + (f": {note}" if note else "")
            )
    else:
        lines.append("Runners' wake-ups: no runner listening (no runworkflows process is alive)")
    return "\n".join(lines)


def render_flow(flows: list[KindFlow]) -> list[str]:
    """Each limited kind: its limits, attempts running (slots in use) and the due items
    waiting for a key, a slot or the rate."""
    if not flows:
        return []
    lines = ["Flow control (due items waiting, by reason):"]
    width = max(len(item.kind) for item in flows)
    for item in flows:
        slots = f"{item.slots_in_use}/{item.concurrency}" if item.concurrency else str(item.slots_in_use)
        lines.append(
            f"  {item.kind.ljust(width)}  {item.limits}; running {slots}; waiting: "
            f"key {item.waiting['key']}, slot {item.waiting['slot']}, rate {item.waiting['rate']}"
        )
    return lines


def render_stale(report: StatusReport) -> list[str]:
    """Processing rows whose heartbeat is older than STALE_AFTER (or that have none): by
    kind, and the one stale longest (by kind and id only)."""
    if not report.stale:
        return []
    lines = [
        f"Stale claims ({sum(report.stale.values())}; processing, heartbeat older than STALE_AFTER: the "
        "runner died or lost the database, or a lock has been held on the row that long; a live "
        "runner of the kind takes them over, one with no heartbeat waits for an operator):"
    ]
    width = max(len(kind) for kind in report.stale)
    lines.extend(f"  {kind.ljust(width)}  {n}" for kind, n in report.stale.items())
    lines.append(f"  oldest: {_stale_claim(report)}")
    return lines


def _stale_claim(report: StatusReport) -> str:
    work, since = report.oldest_stale, report.oldest_stale_since
    assert work is not None  # found together with since
    assert since is not None
    attempt = describe_attempt(work.kind, work.attempt, work.backend_name)
    ago = (report.generated_at - since).total_seconds()
    if work.heartbeat_at is None:
        heard = "no heartbeat"
    else:
        heard = f"last heartbeat {work.heartbeat_at:%Y-%m-%d %H:%M:%S %Z}"
    return (
        f"{work.kind} #{work.pk} ({attempt}), a stale claim, stale since "
        f"{since:%Y-%m-%d %H:%M:%S %Z} ({ago:.0f}s ago; {heard})"
    )


def render_unknown(unknown_due: dict[str, int]) -> list[str]:
    """Due work of kinds no runner of this project runs: it stays pending until code that
    registers the kind runs, or it is deleted."""
    if not unknown_due:
        return []
    lines = [
        f"Due, but no runner here knows the kind ({sum(unknown_due.values())}; it stays pending: "
        "register the kind again, or delete the work in the admin):"
    ]
    width = max(len(kind) for kind in unknown_due)
    lines.extend(f"  {kind.ljust(width)}  {n}" for kind, n in unknown_due.items())
    return lines

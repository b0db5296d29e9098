"""How deferred work looks on the admin triage desk: badges, attempt counts, JSON, history.

Plain functions of a row (or a value) returning safe HTML, so that the list page and the
detail page render a row the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import router
from django.utils import timezone
from django.utils.dateformat import format as format_date
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from django.utils.timesince import timesince

from nexus_workflows.clock import database_now
from nexus_workflows.deferred import attempts as attempts_module
from nexus_workflows.deferred.attempts import max_attempts
from nexus_workflows.deferred.history import first_line
from nexus_workflows.deferred.triage import is_stale
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.redaction import APP_REASONS, error_type

DATETIME_FORMAT = "Y-m-d H:i:s"
COMPACT_FORMAT = "M j, H:i"
EMPTY = mark_safe('<span class="nw-muted">—</span>')

#: The attribute the admin sets on the rows it reads: the database's time of the read,
#: which every "ago", "due now" and "stale" on the page is judged by (README "One clock").
NOW_ATTRIBUTE = "nw_database_now"


def read_now(request: Any, rows: list[DeferredWork], using: str) -> None:
    """Give ``rows`` the database's time, read once per request (one query a page)."""
    now = getattr(request, NOW_ATTRIBUTE, None)
    if now is None:
        now = database_now(using)
        setattr(request, NOW_ATTRIBUTE, now)
    for work in rows:
        setattr(work, NOW_ATTRIBUTE, now)


def now_of(work: DeferredWork) -> datetime:
    """The database's time for judging ``work``: what the admin read with the row, else
    one query to the database it came from."""
    now = getattr(work, NOW_ATTRIBUTE, None)
    if now is None:
        now = database_now(work._state.db or router.db_for_read(DeferredWork))
        setattr(work, NOW_ATTRIBUTE, now)
    return now


def when(value: datetime | None, *, now: datetime | None = None, compact: bool = False) -> SafeString:
    """A local time and how long ago (or how soon) it is.

    ``compact`` (list columns) leads with the relative time and shortens the exact one;
    the full timestamp is always in the tooltip.
    """
    if value is None:
        return EMPTY
    if now is None:
        now = database_now(router.db_for_read(DeferredWork))
    local = timezone.localtime(value)
    seconds = (value - now).total_seconds()
    if abs(seconds) < 60:
        relative = "just now" if seconds <= 0 else "in under a minute"
    elif seconds < 0:
        relative = f"{timesince(value, now, depth=1)} ago"
    else:
        relative = f"in {timesince(now, value, depth=1)}"
    exact = format_date(local, COMPACT_FORMAT if compact else DATETIME_FORMAT)
    first, second = (relative, exact) if compact else (exact, relative)
    return format_html(
        '<time datetime="{}" title="{}">{}</time><span class="nw-relative">{}</span>',
        local.isoformat(),
        format_date(local, DATETIME_FORMAT + " T"),
        first,
        second,
    )


def status_badge(work: DeferredWork, *, now: datetime | None = None) -> SafeString:
    if work.status == Status.PROCESSING and is_stale(work, now or now_of(work)):
        return format_html(
            '<span class="nw-badge nw-badge--stale" title="{}">processing · stale</span>',
            "No heartbeat from its runner for longer than STALE_AFTER",
        )
    label = dict(Status.choices).get(work.status, work.status)  # an unknown status still renders
    return format_html('<span class="nw-badge nw-badge--{}">{}</span>', work.status, label.lower())


def attempt_number(work: DeferredWork) -> int:
    """The number of the attempt that runs next, runs now, or ran last (from 1)."""
    return attempts_module.attempt_number(work.kind, work.attempt, work.backend_name)


def allowed_attempts(work: DeferredWork) -> int | None:
    """Runs the row's kind (or Django task) is allowed, None where that is unknown here."""
    return max_attempts(work.kind, work.backend_name)


def attempts(work: DeferredWork) -> SafeString:
    allowed = allowed_attempts(work)
    if allowed is None:
        unknown = (
            "This task cannot be loaded in this process, so its retry schedule is unknown"
            if work.backend_name
            else "This kind is not registered in this project, so its retry schedule is unknown"
        )
        number = attempts_module.number_of(work.attempt, None)  # not looked up a second time
        return format_html('{} of <span class="nw-muted" title="{}">?</span>', number, unknown)
    number = attempts_module.number_of(work.attempt, allowed)  # a task's schedule: read once
    css = " nw-attempts--last" if number >= allowed and work.status != Status.DONE else ""
    return format_html('<span class="nw-attempts{}">{} of {}</span>', css, number, allowed)


def next_attempt(work: DeferredWork, *, now: datetime | None = None, compact: bool = False) -> SafeString:
    """When pending work runs next; for processing work, how alive its runner is, by the
    database's clock (``now``, else :func:`now_of`)."""
    if work.status not in (Status.PENDING, Status.PROCESSING):
        return EMPTY
    now = now or now_of(work)
    if work.status == Status.PENDING:
        if work.next_attempt_at <= now:
            return format_html(
                '<span class="nw-due">due now</span>{}', when(work.next_attempt_at, now=now, compact=compact)
            )
        return when(work.next_attempt_at, now=now, compact=compact)
    if work.status == Status.PROCESSING:
        if work.heartbeat_at is None:
            return mark_safe('<span class="nw-stale">running, no heartbeat</span>')
        label = "heartbeat stale" if is_stale(work, now) else "heartbeat"
        css = "nw-stale" if is_stale(work, now) else "nw-running"
        return format_html(
            '<span class="{}">{}</span>{}', css, label, when(work.heartbeat_at, now=now, compact=compact)
        )
    return EMPTY


def error_type_badge(text: str) -> SafeString:
    """The recorded error's exception type only: its message may carry patient data."""
    name = error_type(text)
    if not name:
        return EMPTY
    return format_html('<code class="nw-error-type">{}</code>', name)


def error_summary(text: str, *, length: int = 110) -> SafeString:
    line = first_line(text)
    if not line:
        return EMPTY
    return format_html('<span class="nw-error-line">{}</span>', Truncator(line).chars(length))


# --- detail page --------------------------------------------------------------------------

_JSON_TOKEN = re.compile(
    r'(?P<key>"(?:\\.|[^"\\])*")(?=\s*:)'
    r'|(?P<string>"(?:\\.|[^"\\])*")'
    r"|(?P<number>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
    r"|(?P<literal>\btrue\b|\bfalse\b|\bnull\b)"
)


def json_block(value: Any, *, empty: str = "empty") -> SafeString:
    """``value`` as indented JSON with keys, strings, numbers and literals tagged for
    colouring. Everything is escaped; the tags are the only markup."""
    if value in (None, {}, []):
        return format_html('<p class="nw-muted">{}</p>', empty)
    text = json.dumps(value, indent=2, ensure_ascii=False)
    parts: list[str] = []
    position = 0
    for match in _JSON_TOKEN.finditer(text):
        parts.append(escape(text[position : match.start()]))
        parts.append(f'<span class="nw-json-{match.lastgroup}">{escape(match.group())}</span>')
        position = match.end()
    parts.append(escape(text[position:]))
    return mark_safe(f'<pre class="nw-json">{"".join(parts)}</pre>')


def error_block(text: str) -> SafeString:
    if not text:
        return format_html('<p class="nw-muted">{}</p>', "No error recorded.")
    return format_html('<pre class="nw-error">{}</pre>', text)


_OUTCOMES = {
    "rescheduled": ("failed", "retry scheduled", "warn"),
    "abandoned": ("failed", "abandoned", "bad"),
    "lost": ("lost", "the runner stopped heart-beating", "bad"),
    "revived": ("revived", "", "good"),
    "released": ("released", "not counted", "warn"),
}


@dataclass(frozen=True)
class HistoryRow:
    at: datetime | None
    attempt: str
    label: str
    detail: str
    tone: str
    error: str


def history_rows(work: DeferredWork, *, reveal: bool = False) -> list[HistoryRow]:
    """The row's history entries, oldest first, in words. Unknown entry shapes are
    shown as they are rather than dropped — with ``reveal`` only: without it, errors are
    reduced to their type and only the runner's own reasons are shown."""
    allowed = allowed_attempts(work)
    rows = []
    for entry in work.history or []:
        if not isinstance(entry, dict):
            rows.append(HistoryRow(None, "", "entry", str(entry) if reveal else "", "", ""))
            continue
        what = str(entry.get("outcome") or entry.get("event") or "entry")
        label, detail, tone = _OUTCOMES.get(what, (what, "", ""))
        if what == "lost" and entry.get("started") is False:
            detail = "the runner stopped before this attempt started; not counted"
        if what not in _OUTCOMES and not reveal:
            label = "entry"
        if entry.get("reason") and (reveal or entry["reason"] in APP_REASONS):
            detail = f"{detail}: {entry['reason']}" if detail else str(entry["reason"])
        if what == "revived":
            who = entry.get("by", "")
            detail = f"by {who}" + (f" ({entry['user']})" if entry.get("user") else "") if who else ""
        attempt = entry.get("attempt")
        number = ""
        if isinstance(attempt, int) and not isinstance(attempt, bool):
            number = f"{attempt + 1} of {allowed}" if allowed else str(attempt + 1)
        error = str(entry.get("error") or "")
        if not reveal:
            error = error_type(error)
        rows.append(HistoryRow(_parse_time(entry.get("at")), number, label, detail, tone, error))
    return rows


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return timezone.localtime(parsed) if timezone.is_aware(parsed) else parsed

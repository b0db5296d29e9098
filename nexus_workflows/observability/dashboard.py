"""The dashboard on the triage desk: per kind, outcomes per 5 minutes over 24 hours, the
pending depth and the oldest due age, drawn as SVG on the server (no JavaScript).

Everything comes from small reads: the per-minute outcome counts (at most 1,440 rows per
kind and outcome), the per-status counts of :mod:`.figures` and the runner rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connections
from django.utils import timezone
from django.utils.dateformat import format as format_date
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

from nexus_workflows import sql
from nexus_workflows.observability.figures import work_figures
from nexus_workflows.observability.models import OutcomeCount
from nexus_workflows.observability.runners import count_alive

BUCKET = timedelta(minutes=5)
WINDOW = timedelta(hours=24)
BUCKETS = int(WINDOW / BUCKET)  # 288
SHOWN = ("done", "rescheduled", "abandoned")  # stacked in this order, bottom up


@dataclass
class KindPanel:
    kind: str
    pending: int
    processing: int
    abandoned_rows: int
    #: Stale claims (:attr:`.figures.WorkFigures.stale`).
    stale_claims: int
    oldest_due_age: float
    series: dict[str, list[int]] = field(default_factory=dict)  # outcome -> BUCKETS counts
    window_start: datetime | None = None

    @property
    def idle(self) -> bool:
        """Nothing ran in the window and nothing waits: shown as a name only."""
        return not (
            self.pending or self.processing or self.abandoned_rows or any(map(any, self.series.values()))
        )

    @property
    def total_done(self) -> int:
        return sum(self.series["done"])

    @property
    def total_rescheduled(self) -> int:
        return sum(self.series["rescheduled"])

    @property
    def total_abandoned(self) -> int:
        return sum(self.series["abandoned"])

    @property
    def oldest_due_text(self) -> str:
        if self.oldest_due_age < 1:
            return "nothing overdue"
        return f"{_duration(self.oldest_due_age)} overdue"

    @property
    def chart(self) -> SafeString:
        return render_chart(self.kind, self.series, self.window_start)


@dataclass
class Dashboard:
    now: datetime
    start: datetime
    panels: list[KindPanel]
    runners_alive: int
    runners_dead: int

    @property
    def active(self) -> list[KindPanel]:
        return [panel for panel in self.panels if not panel.idle]

    @property
    def idle_kinds(self) -> list[str]:
        return [panel.kind for panel in self.panels if panel.idle]


def bucket_start(now: datetime) -> datetime:
    """Start of the oldest 5-minute bucket shown, so that the newest one holds ``now``."""
    floored = now.replace(minute=now.minute - now.minute % 5, second=0, microsecond=0)
    return floored - BUCKET * (BUCKETS - 1)


def _bucketed(using: str, start: datetime) -> list[tuple[str, str, int, int]]:
    """``(kind, outcome, bucket index, attempts)`` since ``start``, summed per 5 minutes by
    the database on PostgreSQL, SQLite and MySQL/MariaDB (a day of ten kinds is 43,200
    minute rows)."""
    connection = connections[using]
    table = connection.ops.quote_name(OutcomeCount._meta.db_table)
    statements = sql.for_connection(using)
    epoch = getattr(statements, "EPOCH_OF_MINUTE", None)
    divide = getattr(statements, "INTEGER_DIVIDE", "/")  # of two integers: an integer
    if epoch is None:
        rows = (
            OutcomeCount.objects.using(using)
            .filter(minute__gte=start, outcome__in=SHOWN)
            .values_list("kind", "outcome", "minute", "count")
        )
        return [(kind, outcome, int((minute - start) / BUCKET), n) for kind, outcome, minute, n in rows]
    placeholders = ", ".join(["%s"] * len(SHOWN))
    statement = (
        f"SELECT kind, outcome, ({epoch} - %s) {divide} {int(BUCKET.total_seconds())} AS bucket, SUM(count) "
        f"FROM {table} WHERE minute >= %s AND outcome IN ({placeholders}) GROUP BY kind, outcome, bucket"
    )
    params = [int(start.timestamp()), connection.ops.adapt_datetimefield_value(start), *SHOWN]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return [(kind, outcome, int(bucket), int(n)) for kind, outcome, bucket, n in cursor.fetchall()]


def build(using: str) -> Dashboard:
    figures = work_figures(using)
    start = bucket_start(figures.now)
    series: dict[str, dict[str, list[int]]] = {}
    for kind, outcome, index, count in _bucketed(using, start):
        if 0 <= index < BUCKETS:
            by_outcome = series.setdefault(kind, {name: [0] * BUCKETS for name in SHOWN})
            by_outcome[outcome][index] += count
    kinds = sorted(set(figures.kinds) | set(series))
    panels = []
    for kind in kinds:
        panels.append(
            KindPanel(
                kind=kind,
                pending=figures.count(kind, "pending"),
                processing=figures.count(kind, "processing"),
                abandoned_rows=figures.count(kind, "abandoned"),
                stale_claims=figures.stale.get(kind, 0),
                oldest_due_age=figures.oldest_due_age(kind),
                series=series.get(kind, {name: [0] * BUCKETS for name in SHOWN}),
                window_start=start,
            )
        )
    alive, dead = count_alive(using)
    return Dashboard(figures.now, start, panels, alive, dead)


def _duration(seconds: float) -> str:
    # A length of time, not a judgement: any fixed end serves, never this host's clock.
    end = datetime(2001, 1, 1, tzinfo=UTC)
    return timesince(end - timedelta(seconds=seconds), end, depth=2)


# --- the chart ---------------------------------------------------------------------------

WIDTH, HEIGHT = 880, 150
LEFT, RIGHT, TOP, BOTTOM = 44, 22, 10, 24
COLOURS = {"done": "#4caf6e", "rescheduled": "#e0a024", "abandoned": "#d9473b"}


def _nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, … not below ``value`` (at least 1)."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor >= value:
                return step * factor
        step *= 10


def render_chart(kind: str, series: dict[str, list[int]], start: datetime | None) -> SafeString:
    """Stacked bars, one per 5 minutes: done, rescheduled, abandoned.

    Numbers are written as they are; every text (the kind, the time labels) is escaped.
    """
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    totals = [sum(series[name][i] for name in SHOWN) for i in range(BUCKETS)]
    top = _nice_ceiling(max(totals, default=0))
    bar_w = plot_w / BUCKETS
    parts: list[str] = []
    # Grid: 0, half and the top, labelled on the left.
    for value in (0, top / 2, top):
        y = TOP + plot_h - plot_h * value / top
        parts.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" class="nw-grid"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="nw-axis" text-anchor="end">{value:g}</text>'
        )
    # Bars: each outcome stacked on the ones below it.
    width = max(bar_w - 0.6, 0.8)
    for index in range(BUCKETS):
        base = 0
        x = LEFT + index * bar_w
        for name in SHOWN:
            n = series[name][index]
            if not n:
                continue
            y = TOP + plot_h - plot_h * (base + n) / top
            parts.append(
                f'<rect x="{x:.2f}" y="{y:.2f}" width="{width:.2f}" height="{plot_h * n / top:.2f}" '
                f'fill="{COLOURS[name]}"/>'
            )
            base += n
    # Time axis: a tick every 3 hours, in the site's time zone.
    if start is not None:
        for index in range(0, BUCKETS + 1, 36):
            x = LEFT + index * bar_w
            label = escape(format_date(timezone.localtime(start + BUCKET * index), "H:i"))
            parts.append(
                f'<line x1="{x:.1f}" y1="{TOP + plot_h}" x2="{x:.1f}" y2="{TOP + plot_h + 4}" '
                'class="nw-tick"/>'
                f'<text x="{x:.1f}" y="{HEIGHT - 6}" class="nw-axis" text-anchor="middle">{label}</text>'
            )
    summary = ", ".join(f"{sum(series[name])} {name}" for name in SHOWN)
    return format_html(
        '<svg class="nw-chart" viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
        'aria-label="{}" data-kind="{}"><title>{}</title>{}</svg>',
        WIDTH,
        HEIGHT,
        WIDTH,
        HEIGHT,
        f"{kind}: outcomes per 5 minutes over 24 hours ({summary})",
        kind,
        f"{kind}: {summary} in 24 hours",
        mark_safe("".join(parts)),  # numbers and escaped labels only
    )


def legend() -> SafeString:
    return format_html_join(
        "",
        '<span class="nw-legend-item"><span class="nw-swatch" style="background:{}"></span>{}</span>',
        ((COLOURS[name], name) for name in SHOWN),
    )

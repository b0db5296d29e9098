"""Reading the span ledger the flow test workflows write, and what it proves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Span:
    kind: str
    key: str
    group: str
    pid: int
    started: float
    ended: float


def read_spans(path: Path) -> list[Span]:
    if not path.exists():
        return []
    spans = []
    for line in path.read_text().splitlines():
        kind, key, group, pid, started, ended = line.split()
        spans.append(Span(kind, key, group, int(pid), float(started), float(ended)))
    return spans


def max_overlap(spans: list[Span]) -> int:
    """The most spans running at one instant (an end and a start at the same instant do
    not overlap)."""
    events = sorted([(s.started, 1) for s in spans] + [(s.ended, -1) for s in spans])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def most_starts_in_window(spans: list[Span], period: float) -> int:
    """The most starts in any half-open window [t, t + period)."""
    starts = sorted(s.started for s in spans)
    best = 0
    first = 0
    for last, started in enumerate(starts):
        while started - starts[first] >= period:
            first += 1
        best = max(best, last - first + 1)
    return best

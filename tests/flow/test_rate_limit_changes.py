"""A deploy that changes a rate window's limit: the starts already made in the current
period count against the new limit from the moment it is deployed.

A window is a ring of ``limit`` rows; a lowered limit leaves the larger ring's rows above
it, whose starts must still count (before, only rows below the new limit were read, so
(1000, 86400) lowered to (100, 86400) allowed about 1,100 starts that day). The claims
here are the runner's own (``Claimer``) against the real database, each backend.
"""

from __future__ import annotations

from typing import Any

import pytest

from nexus_workflows import enqueue_many
from nexus_workflows.clock import DatabaseNow
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.registry import registry
from nexus_workflows.exceptions import RateLimitTimeout
from nexus_workflows.flow.claiming import window_name
from nexus_workflows.flow.report import flow_report
from nexus_workflows.flow.windows import (
    _fold,
    busy_count,
    free_slots,
    rate_limited,
    seconds_until_free,
    take_starts,
)
from nexus_workflows.models import FlowWindowSlot
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = 3600.0


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def redeploy(register_workflow: Any, kind: str, **flow: Any) -> None:
    """The kind as a new deploy registers it: same kind, other limits."""
    registry.unregister(kind)
    register_workflow(noop, kind=kind, retry_schedule=[1], **flow)


def claim(kind: str, limit: int = 100) -> int:
    return len(Claimer(kinds=[kind], using="default").claim_due(limit))


def test_a_lowered_limit_counts_the_starts_made_under_the_larger_one(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(100, HOUR)).kind
    enqueue_many(kind, [{"key": n} for n in range(60)])
    assert claim(kind, 30) == 30  # 30 starts this hour, on 30 of 100 rows

    redeploy(register_workflow, kind, rate_limit=(10, HOUR))
    assert claim(kind) == 0, "30 starts this hour already exceed the new limit of 10"
    (report,) = [r for r in flow_report() if r.kind == kind]
    assert report.waiting["rate"] == 30  # every due item waits for the rate
    # Nothing was lost: every start is still a stamp of the ring.
    assert busy_count(window_name(kind), "", 10, HOUR, using="default") == 30

    # Raised again within the hour: the 30 starts still count, 10 more may start.
    redeploy(register_workflow, kind, rate_limit=(40, HOUR))
    assert claim(kind) == 10
    assert claim(kind) == 0


def test_a_lowered_limit_per_rate_key_counts_each_keys_earlier_starts(register_workflow: Any) -> None:
    def sender(trigger: Any) -> str:
        return str(trigger["sender"])

    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(1000, HOUR), rate_key=sender).kind
    enqueue_many(kind, [{"key": f"a{n}", "sender": "a"} for n in range(30)])
    assert claim(kind) == 30  # key a: 30 of its 1000

    redeploy(register_workflow, kind, rate_limit=(5, HOUR), rate_key=sender)
    enqueue_many(kind, [{"key": f"a{n}", "sender": "a"} for n in range(30, 40)])
    enqueue_many(kind, [{"key": f"b{n}", "sender": "b"} for n in range(10)])
    # Key a is over its new limit; key b (no start yet) gets its 5.
    assert claim(kind) == 5
    assert FlowWindowSlot.objects.filter(name=window_name(kind)).exclude(key_hash="").count() >= 1005


def test_rate_limited_with_a_lowered_limit_counts_the_larger_rings_starts() -> None:
    for _ in range(15):
        with rate_limited("lowered-window", 200, HOUR, timeout=0):
            pass
    with pytest.raises(RateLimitTimeout), rate_limited("lowered-window", 10, HOUR, timeout=0):
        pass
    # Raised to 25: 15 made, 10 more.
    for _ in range(10):
        with rate_limited("lowered-window", 25, HOUR, timeout=0):
            pass
    with pytest.raises(RateLimitTimeout), rate_limited("lowered-window", 25, HOUR, timeout=0):
        pass


def test_a_shortened_period_frees_rows_at_the_new_period_and_never_loses_a_start(
    register_workflow: Any,
) -> None:
    """Shortening is safe: two starts on a row were at least the old, longer period
    apart, so every start of the new period's window is still its row's stamp."""
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(5, HOUR)).kind
    enqueue_many(kind, [{"key": n} for n in range(20)])
    assert claim(kind) == 5
    redeploy(register_workflow, kind, rate_limit=(5, HOUR / 2))
    assert claim(kind) == 0  # those 5 are within the new half hour too


def two_starts_on_one_row(name: str, period: float) -> None:
    """A window of one start per ``period``: a start, and another once the period passed,
    on its only row (the first is no longer any row's stamp)."""
    assert take_starts(name, "", 1, period, 1, using="default") == 1
    wait_for(lambda: take_starts(name, "", 1, period, 1, using="default") == 1, timeout=10, interval=0.02)


def test_a_lengthened_period_counts_the_starts_the_shorter_one_hid() -> None:
    """Two starts within 0.2 s, one a row's stamp and one hidden behind it; the window
    becomes 2 per hour (a raised limit adds a free row): those two fill it. Before, the
    new row was offered: three starts within the hour."""
    two_starts_on_one_row("lengthened", 0.1)
    assert take_starts("lengthened", "", 2, HOUR, 1, using="default") == 0
    assert free_slots("lengthened", "", 2, HOUR, using="default") == []
    # Until the hidden start leaves the hour: the hour less the old period, from the last start.
    assert HOUR - 0.1 - 60 < seconds_until_free("lengthened", "", 2, HOUR, using="default") <= HOUR
    with pytest.raises(RateLimitTimeout), rate_limited("lengthened", 2, HOUR, timeout=0):
        pass


def test_a_lengthened_period_pauses_only_until_the_hidden_starts_left_it() -> None:
    """From 0.1 s to 0.3 s: the pause lasts 0.2 s from the last start, then the new
    window's own rule holds (2 rows: one free, one still holding its latest start)."""
    name = "briefly-lengthened"
    two_starts_on_one_row(name, 0.1)
    wait_for(lambda: take_starts(name, "", 2, 0.3, 1, using="default") == 1, timeout=10, interval=0.02)
    starts = sorted(FlowWindowSlot.objects.filter(name=name).values_list("started_at", flat=True))
    assert (starts[1] - starts[0]).total_seconds() >= 0.2  # paused until the hidden start left


def test_a_claim_after_a_lengthened_period_counts_the_shorter_periods_starts(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(1, 0.1)).kind
    two_starts_on_one_row(window_name(kind), 0.1)  # as the kind's attempts stamp them
    enqueue_many(kind, [{"key": n} for n in range(10)])
    redeploy(register_workflow, kind, rate_limit=(2, HOUR))
    assert claim(kind) == 0, "two starts within the hour already fill the new window of 2 an hour"


def test_rows_stamped_before_periods_were_kept_are_taken_as_stamped_under_the_current_one() -> None:
    assert take_starts("unknown-period", "", 2, HOUR, 1, using="default") == 1
    FlowWindowSlot.objects.filter(name="unknown-period").update(period=None)
    assert take_starts("unknown-period", "", 2, 2 * HOUR, 1, using="default") == 1


def test_a_fold_that_races_another_process_moves_nothing_and_the_ring_is_read_again() -> None:
    """The fold swaps stamps by compare-and-set: when a row it read changed meanwhile (a
    start by another process), no swap of that fold is kept, and the next read folds the
    ring as it now is. Nothing is lost either way."""
    name = "raced-fold"
    assert take_starts(name, "", 100, HOUR, 30, using="default") == 30
    rows = list(
        FlowWindowSlot.objects.filter(name=name)
        .annotate(db_now=DatabaseNow())
        .values_list("slot", "started_at", "db_now", "period")
    )

    def above_the_limit() -> dict[int, Any]:
        return dict(FlowWindowSlot.objects.filter(name=name, slot__gte=10).values_list("slot", "started_at"))

    above = above_the_limit()
    # Another process starts on every row below 10 after the fold read them.
    FlowWindowSlot.objects.filter(name=name, slot__lt=10).update(started_at=DatabaseNow())
    assert _fold(name, "", 10, HOUR, rows, using="default")  # raced: rolled back
    assert above_the_limit() == above
    assert free_slots(name, "", 10, HOUR, using="default") == []
    assert busy_count(name, "", 10, HOUR, using="default") >= 30

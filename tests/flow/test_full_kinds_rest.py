"""A limited kind with due rows none of which can start rests like a kind with nothing
due: a ``concurrency`` kind whose slots are all held, a rate-key kind whose due rows'
key windows are all full. A busy runner then asks the database nothing about it until
something can change (one of its own attempts ends, a wake-up names it, a key window's
first start leaves it) or the rest's bound passes.

Queries are counted in-process (``CaptureQueriesContext``) on the lane's own claims."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from nexus_workflows import enqueue
from nexus_workflows.flow import starts
from tests.flow.test_lane_claims import BusyLane
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def sender_of(trigger: Any) -> str:
    return str(trigger["sender"])


def claim_counting_queries(busy: BusyLane) -> tuple[int, int]:
    """One claim turn of the busy lane: (rows claimed, queries made)."""
    with CaptureQueriesContext(connection) as queries:
        claimed = busy.lanes.claim_due(None)[0]
    return claimed, len(queries)


def test_a_concurrency_kind_with_every_slot_held_is_not_asked_until_an_attempt_of_it_ends(
    register_workflow: Any, long_rest: None
) -> None:
    kind = register_workflow(noop, retry_schedule=[1], concurrency=1).kind
    enqueue(kind, {"key": "first"})
    busy = BusyLane([kind])
    assert busy.lanes.claim_due(None)[0] == 1  # its one slot is held from now on
    enqueue(kind, {"key": "second"})
    claimed, asked = claim_counting_queries(busy)  # reads the free slots: none
    assert (claimed, asked > 0) == (0, True)
    for _ in range(3):
        assert claim_counting_queries(busy) == (0, 0)  # resting: no query
    busy.lanes.wake_limited(kind)  # the runner, as the attempt holding the slot ends
    claimed, asked = claim_counting_queries(busy)
    assert asked > 0  # asked again (the slot is still held: nothing claimed)
    assert claimed == 0


def test_a_rate_key_kind_whose_due_keys_have_full_windows_rests_until_the_first_window_frees(
    register_workflow: Any, long_rest: None
) -> None:
    period = 1.0
    kind = register_workflow(
        noop, retry_schedule=[1], rate_limit=(1, period), rate_key=lambda t: t["sender"]
    ).kind
    enqueue(kind, {"key": "a1", "sender": "a"})
    busy = BusyLane([kind])
    assert busy.lanes.claim_due(None)[0] == 1  # reserves key a's one start of the period
    starts.begin(busy.handed_out[0])  # as the runner does, just before prepare
    enqueue(kind, {"key": "a2", "sender": "a"})
    claimed, asked = claim_counting_queries(busy)
    assert (claimed, asked > 0) == (0, True)
    flow = busy.lanes.claimers[next(iter(busy.lanes.claimers))].flow
    assert flow is not None
    # The runner is told when to look again: when key a's start leaves its window.
    assert flow.retry_in is not None
    assert 0 < flow.retry_in <= period + 0.1
    for _ in range(3):
        assert claim_counting_queries(busy) == (0, 0)  # resting: no query
    # Not later than allowed: the rest ends when the window frees, not after _REST.
    wait_for(lambda: busy.lanes.claim_due(None)[0] == 1, timeout=period + 5, what="a2 claimed")
    assert sorted(item.trigger["key"] for item in busy.handed_out) == ["a1", "a2"]


def test_a_rate_key_kind_resting_on_full_windows_is_asked_again_on_a_wake_up_naming_it(
    register_workflow: Any, long_rest: None
) -> None:
    kind = register_workflow(
        noop, retry_schedule=[1], rate_limit=(1, 60), rate_key=lambda t: t["sender"]
    ).kind
    enqueue(kind, {"key": "a1", "sender": "a"})
    busy = BusyLane([kind])
    assert busy.lanes.claim_due(None)[0] == 1
    enqueue(kind, {"key": "a2", "sender": "a"})
    assert busy.lanes.claim_due(None)[0] == 0  # key a's window is full for a minute: rests
    work_id = int(enqueue(kind, {"key": "b1", "sender": "b"}) or 0)
    assert claim_counting_queries(busy) == (0, 0)
    busy.lanes.new_work(work_id, kind)  # the listener, on the NOTIFY naming the row
    assert busy.lanes.claim_due(None)[0] == 1
    assert [item.trigger["key"] for item in busy.handed_out] == ["a1", "b1"]


def test_a_resting_limited_kind_is_asked_when_its_delayed_row_comes_due(
    register_workflow: Any, long_rest: None
) -> None:
    """Nothing announces a delayed row coming due: a kind that finds nothing due rests
    only until its first pending row is due, not for the whole rest."""
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(100, 60)).kind
    enqueue(kind, {"key": "later"}, delay=1.0)
    busy = BusyLane([kind])
    claimed, asked = claim_counting_queries(busy)  # nothing due yet: it rests
    assert (claimed, asked > 0) == (0, True)
    assert claim_counting_queries(busy) == (0, 0)
    wait_for(lambda: busy.lanes.claim_due(None)[0] == 1, timeout=5, what="the delayed row claimed")
    assert [item.trigger["key"] for item in busy.handed_out] == ["later"]


def test_a_rate_key_kind_whose_full_windows_free_during_its_claim_is_asked_again_not_rested(
    register_workflow: Any, long_rest: None
) -> None:
    """The claim read every due row's key window full, and by its next query (when the
    first start leaves) none is: the windows freed in between. The kind is asked again at
    the next turn; it rested as if every key were busy (the whole rest) before."""
    import time

    from nexus_workflows.flow.claiming import FlowClaimer
    from nexus_workflows.models import DeferredWork

    kind = register_workflow(
        noop,
        retry_schedule=[1],
        serial_key=lambda t: t["sender"],
        rate_limit=(1, 60),
        rate_key=lambda t: t["sender"],
    ).kind
    enqueue(kind, {"key": "a1", "sender": "a"})
    flow = FlowClaimer.for_kinds([kind], "default")
    assert flow is not None
    candidates = DeferredWork.objects.filter(kind=kind)  # due, and no start in key a's window
    assert flow._rest_for_key_windows(kind, 60, candidates) is None
    assert flow._resting(kind, time.monotonic()) == 0
    assert flow._rest_for_key_windows(kind, 60, candidates.none()) == []  # no candidate at all


def test_a_rate_key_kind_whose_full_windows_free_during_its_claim_has_an_idle_runner_look_again_at_once(
    register_workflow: Any, long_rest: None
) -> None:
    """As above: the kind is asked again at the next turn. An idle runner's next turn is
    its poll interval away (nothing announces a window freeing), so the claim tells it to
    look again at once; on the old code ``retry_in`` stayed None and the row waited for
    the poll."""
    from nexus_workflows.flow.claiming import FlowClaimer
    from nexus_workflows.models import DeferredWork

    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(1, 60), rate_key=sender_of).kind
    enqueue(kind, {"key": "a1", "sender": "a"})
    flow = FlowClaimer.for_kinds([kind], "default")
    assert flow is not None
    assert flow.retry_in is None
    candidates = DeferredWork.objects.filter(kind=kind)  # due, and no start in key a's window
    assert flow._rest_for_key_windows(kind, 60, candidates) is None
    assert flow.retry_in == 0

"""A limited kind that found nothing rests before a runner asks it again (a busy runner
claims many times a second); the rest ends as soon as the kind could have something: a
wake-up naming it or naming no kind, or one of the runner's own attempts of it ending.
And an enqueue of a limited kind names its row in a NOTIFY whether a runner waits or not,
so a busy runner (whose enqueues skip the NOTIFY) hears of it too.

Each test makes the rest a minute long (``flow.claiming._REST``), so a claim made before
the wake-up finds the kind resting however loaded the machine is."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.deferred.wakeup import CHANNEL
from nexus_workflows.flow import claiming
from nexus_workflows.sql import postgresql
from tests.flow.test_lane_claims import BusyLane
from tests.raw_connections import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


@pytest.fixture
def long_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claiming, "_REST", 60.0)


@pytest.fixture
def resting(register_workflow: Any, long_rest: None) -> tuple[BusyLane, str]:
    """A busy lane whose limited kind found nothing, then got a due row: it rests."""
    limited = register_workflow(noop, retry_schedule=[1], rate_limit=(100, 60)).kind
    plain = register_workflow(noop, retry_schedule=[1]).kind
    busy = BusyLane([limited, plain])
    assert busy.lanes.claim_due(None)[0] == 0  # nothing due: the kind rests
    return busy, limited


def test_a_wake_up_naming_a_resting_limited_kind_ends_its_rest(resting: tuple[BusyLane, str]) -> None:
    busy, limited = resting
    work_id = int(enqueue(limited, {"key": "urgent"}) or 0)
    assert busy.lanes.claim_due(None)[0] == 0  # resting: not asked
    busy.lanes.new_work(work_id, limited)  # the listener, on the NOTIFY "<id> <kind>"
    assert busy.lanes.claim_due(None)[0] == 1
    assert [item.id for item in busy.handed_out] == [work_id]


def test_a_wake_up_naming_another_kind_leaves_the_rest(
    resting: tuple[BusyLane, str], register_workflow: Any
) -> None:
    busy, limited = resting
    other = register_workflow(noop, retry_schedule=[1], concurrency=3).kind
    enqueue(limited, {"key": "urgent"})
    busy.lanes.new_work(1, other)
    assert busy.lanes.claim_due(None)[0] == 0


@pytest.mark.postgresql
def test_a_wake_up_naming_no_row_ends_every_limited_kinds_rest(resting: tuple[BusyLane, str]) -> None:
    """Many rows inserted at once, a revive, a release: the NOTIFY names no kind."""
    from nexus_workflows.deferred import wakeup

    busy, limited = resting
    enqueue_many(limited, [{"key": 1}, {"key": 2}])
    assert busy.lanes.claim_due(None)[0] == 0
    event = threading.Event()
    listener = wakeup.PostgresListener(
        "default", event, on_new_work=busy.lanes.new_work, on_any_work=busy.lanes.wake_limited
    )
    listener._received("")  # the payload of such a NOTIFY (the thread is not started)
    assert event.is_set()
    assert busy.lanes.claim_due(None)[0] == 2


def test_one_of_its_own_attempts_ending_ends_a_limited_kinds_rest(resting: tuple[BusyLane, str]) -> None:
    busy, limited = resting
    enqueue(limited, {"key": "urgent"})
    assert busy.lanes.claim_due(None)[0] == 0
    busy.lanes.wake_limited(limited)  # the runner, as an attempt of it ends
    assert busy.lanes.claim_due(None)[0] == 1


@pytest.mark.postgresql
def test_an_enqueue_of_a_limited_kind_names_its_row_even_when_no_runner_waits(
    register_workflow: Any,
) -> None:
    """No runner holds the waiting lock (each has a backlog), so the trigger sends no
    NOTIFY: the enqueue of a limited kind sends one naming its row; a plain kind's none."""
    limited = register_workflow(noop, retry_schedule=[1], rate_limit=(100, 60)).kind
    plain = register_workflow(noop, retry_schedule=[1]).kind
    with raw_connection() as listener, raw_connection() as sender:
        postgresql.listen(listener, CHANNEL)
        enqueue(plain, {"key": "plain"})
        enqueue_many(plain, [{"key": 1}, {"key": 2}])
        work_id = enqueue(limited, {"key": "limited"})
        enqueue_many(limited, [{"key": 1}, {"key": 2}])
        sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=3)]
    assert payloads == [f"{work_id} {limited}", "", "marker"]


@pytest.mark.postgresql
def test_a_waiting_runner_gets_one_notify_for_a_limited_row_enqueued_in_a_transaction(
    register_workflow: Any,
) -> None:
    """The trigger's NOTIFY and the enqueue's name the same row in one transaction:
    PostgreSQL delivers it once."""
    from django.db import transaction

    limited = register_workflow(noop, retry_schedule=[1], rate_limit=(100, 60)).kind
    with raw_connection() as listener, raw_connection() as sender:
        postgresql.listen(listener, CHANNEL)
        postgresql.hold_waiting_lock(listener)  # as an idle runner's listener does
        with transaction.atomic():
            work_id = enqueue(limited, {"key": "limited"})
        sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    assert payloads == [f"{work_id} {limited}", "marker"]

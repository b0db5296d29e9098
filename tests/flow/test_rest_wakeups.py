"""A limited kind that found nothing rests before a runner asks it again (a busy runner
claims many times a second); the rest ends as soon as the kind could have something: a
wake-up naming it or naming no kind, or one of the runner's own attempts of it ending.
And an enqueue of a limited kind names its row in a NOTIFY while a busy runner rests the
kind (it holds the kind's rest lock: ``deferred.rest_locks``), not otherwise.

Each test makes the rest a minute long (``flow.claiming._REST``), so a claim made before
the wake-up finds the kind resting however loaded the machine is."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.deferred.wakeup import CHANNEL
from nexus_workflows.sql import postgresql
from tests.flow.test_lane_claims import BusyLane
from tests.raw_connections import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


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
def test_an_enqueue_of_a_limited_kind_notifies_only_while_a_runner_rests_that_kind(
    register_workflow: Any,
) -> None:
    """No runner holds the waiting lock (each has a backlog): the trigger notifies only
    for rows of a kind some runner rests (it holds the kind's rest lock), naming the row;
    an enqueue of a kind no runner rests, limited or not, sends nothing."""
    limited = register_workflow(noop, retry_schedule=[1], rate_limit=(100, 60)).kind
    other = register_workflow(noop, retry_schedule=[1], concurrency=4).kind
    plain = register_workflow(noop, retry_schedule=[1]).kind
    with raw_connection() as listener, raw_connection() as sender, raw_connection() as resting:
        postgresql.listen(listener, CHANNEL)
        enqueue(limited, {"key": "before"})  # no runner rests it: asked every turn
        postgresql.hold_rest_lock(resting, limited, lock_timeout=5)  # a busy runner rests it
        enqueue(plain, {"key": "plain"})
        enqueue_many(plain, [{"key": 1}, {"key": 2}])
        enqueue(other, {"key": "other"})
        work_id = enqueue(limited, {"key": "limited"})
        enqueue_many(limited, [{"key": 1}, {"key": 2}])
        enqueue_many(other, [{"key": 1}])
        postgresql.release_rest_lock(resting, limited)  # it found work: asked every turn
        enqueue(limited, {"key": "after"})
        sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=3)]
    assert payloads == [f"{work_id} {limited}", "", "marker"]


@pytest.mark.postgresql
def test_a_rest_lock_waits_for_an_open_enqueue_of_its_kind_then_the_kind_is_asked_again(
    register_workflow: Any, long_rest: None
) -> None:
    """The race between a rest beginning and an enqueue committing: an enqueue whose
    trigger ran before the rest lock was taken sent no NOTIFY; taking the lock waits for
    its commit, and once the lock is held the kind is asked again and finds the row."""
    from django.db import transaction

    from nexus_workflows.deferred.rest_locks import RestLocks

    limited = register_workflow(noop, retry_schedule=[1], rate_limit=(100, 60)).kind
    busy = BusyLane([limited])
    assert busy.lanes.claim_due(None)[0] == 0  # nothing due: it rests
    assert busy.lanes.quiet_kinds() == {limited}
    locks = RestLocks(on_held=busy.lanes.wake_limited)
    assert locks.want(busy.lanes.quiet_kinds())
    with raw_connection() as listener, raw_connection() as sender:
        postgresql.listen(listener, CHANNEL)
        with transaction.atomic():
            work_id = int(enqueue(limited, {"key": "racing"}) or 0)  # its trigger: no runner rests it
            locks.settle(listener, listening=True)  # waits 0.1 s for the open enqueue, then gives up
            assert locks.held == set()
        assert busy.lanes.claim_due(None)[0] == 0  # committed, but no NOTIFY: still resting
        sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
        assert payloads == ["marker"]
        locks.settle(listener, listening=True)  # the listener's next turn
        assert locks.held == {limited}
    assert busy.lanes.claim_due(None)[0] == 1  # on_held woke the kind
    assert [item.id for item in busy.handed_out] == [work_id]
    assert busy.lanes.quiet_kinds() == frozenset()  # it found work: no rest lock wanted


def test_a_full_kind_wants_no_rest_lock(register_workflow: Any, long_rest: None) -> None:
    """A kind resting because every slot is held cannot start a new row: its enqueues
    need not notify."""
    kind = register_workflow(noop, retry_schedule=[1], concurrency=1).kind
    enqueue(kind, {"key": "first"})
    busy = BusyLane([kind])
    assert busy.lanes.claim_due(None)[0] == 1
    enqueue(kind, {"key": "second"})
    assert busy.lanes.claim_due(None)[0] == 0  # every slot held: it rests
    assert busy.lanes.quiet_kinds() == frozenset()


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


@pytest.mark.postgresql
def test_a_listener_holds_the_rest_lock_of_a_resting_kind_and_its_enqueue_ends_the_rest(
    register_workflow: Any, long_rest: None
) -> None:
    """A real listener thread: told the kinds the runner rests, it holds their locks, the
    trigger then names a new row of the kind, and the kind is claimed; once the kind found
    work the lock goes, and enqueues of it send nothing."""
    from nexus_workflows.deferred import wakeup
    from tests.processes import wait_for

    limited = register_workflow(noop, retry_schedule=[1], rate_limit=(100, 60)).kind
    busy = BusyLane([limited])
    assert busy.lanes.claim_due(None)[0] == 0  # nothing due: it rests
    event = threading.Event()
    listener = wakeup.PostgresListener(
        "default",
        event,
        on_new_work=busy.lanes.new_work,
        on_any_work=busy.lanes.wake_limited,
        on_rest_held=busy.lanes.wake_limited,
    )
    listener.start()
    try:
        wait_for(lambda: listener.mode is wakeup.WakeupMode.LISTENING, timeout=10, what="wake-ups proven")
        listener.rest_on(busy.lanes.quiet_kinds())
        wait_for(lambda: listener.rest_locks.held == {limited}, timeout=10, what="the rest lock held")
        assert busy.lanes.claim_due(None)[0] == 0  # asked once more (on_held): still nothing
        assert busy.lanes.claim_due(None)[0] == 0  # resting again
        work_id = int(enqueue(limited, {"key": "new"}) or 0)
        wait_for(lambda: busy.lanes.claim_due(None)[0] == 1, timeout=10, what="the new row claimed")
        assert [item.id for item in busy.handed_out] == [work_id]
        listener.rest_on(busy.lanes.quiet_kinds())  # found work: asked every turn
        wait_for(lambda: listener.rest_locks.held == set(), timeout=10, what="the rest lock released")
    finally:
        listener.stop()

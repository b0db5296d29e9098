"""A ``concurrency`` kind with every slot held rests on a busy runner until an attempt of
it ends. One of the runner's own attempts ends the rest at once; one of ANOTHER runner's
did only by the rest's bound (``flow.claiming._REST``). On PostgreSQL the resting runner
now holds the kind's ending lock (``deferred.rest_locks``), and the work table's row
trigger (migration 0019) names an ended row of the kind in a NOTIFY while some runner
holds it, not otherwise; enqueues of a full kind still send nothing.

Each test makes the rest a minute long, so only the wake-up under test ends it in time."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from nexus_workflows import enqueue
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.wakeup import CHANNEL
from nexus_workflows.models import DeferredWork
from nexus_workflows.sql import postgresql
from tests.flow.test_lane_claims import BusyLane
from tests.processes import wait_for
from tests.raw_connections import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


@pytest.fixture
def full_kind(register_workflow: Any, long_rest: None) -> tuple[BusyLane, BusyLane, str]:
    """Two busy runners' lanes of one kind with a single slot: the first holds it (its
    attempt of the row "first" runs), the second found the row "second" and rests."""
    kind = register_workflow(noop, retry_schedule=[1], concurrency=1).kind
    enqueue(kind, {"key": "first"})
    holder, other = BusyLane([kind]), BusyLane([kind])
    assert holder.lanes.claim_due(None)[0] == 1
    enqueue(kind, {"key": "second"})
    assert other.lanes.claim_due(None)[0] == 0  # every slot held: it rests
    return holder, other, kind


def test_a_full_kind_wants_its_ending_lock_until_it_claims(full_kind: tuple[BusyLane, BusyLane, str]) -> None:
    holder, other, kind = full_kind
    assert other.lanes.full_kinds() == {kind}
    assert other.lanes.quiet_kinds() == frozenset()  # its enqueues need not notify
    transitions.finish_done(holder.handed_out)
    other.lanes.wake_limited(kind)  # as the NOTIFY of that end does
    assert other.lanes.claim_due(None)[0] == 1
    assert other.lanes.full_kinds() == frozenset()


@pytest.mark.postgresql
def test_an_attempt_of_a_full_kind_ending_notifies_only_while_a_runner_holds_its_ending_lock(
    full_kind: tuple[BusyLane, BusyLane, str],
) -> None:
    """The row trigger sends "ended <kind>" (migration 0020) for the end while some runner rests the
    kind until an attempt ends; nothing for an end nobody waits for, nor for enqueues."""
    holder, _other, kind = full_kind
    with raw_connection() as listener, raw_connection() as sender, raw_connection() as resting:
        postgresql.listen(listener, CHANNEL)
        postgresql.hold_rest_lock(resting, kind, lock_timeout=5, lock_class=postgresql.ENDING_LOCK_CLASS)
        enqueue(kind, {"key": "third"})  # a full kind's enqueue: nothing
        (first,) = holder.handed_out
        transitions.finish_done([first])
        assert holder.lanes.claim_due(None)[0] == 1  # "second" takes the slot
        postgresql.release_rest_lock(resting, kind, postgresql.ENDING_LOCK_CLASS)
        transitions.finish_done(holder.handed_out[1:])  # nobody rests it: nothing
        sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    assert payloads == [f"ended {kind}", "marker"]


@pytest.mark.postgresql
def test_a_slot_freed_by_another_runner_ends_the_rest_of_a_full_kind_through_its_listener(
    full_kind: tuple[BusyLane, BusyLane, str],
) -> None:
    """A real listener thread of the resting runner holds the kind's ending lock; the
    other runner's attempt ends, and the resting runner claims the waiting row long
    before its minute's rest would end."""
    from nexus_workflows.deferred import wakeup

    holder, other, kind = full_kind
    event = threading.Event()
    listener = wakeup.PostgresListener(
        "default",
        event,
        on_new_work=other.lanes.new_work,
        on_kind_ended=other.lanes.kind_ended,
        on_any_work=other.lanes.wake_limited,
        on_rest_held=other.lanes.wake_limited,
    )
    listener.start()
    try:
        wait_for(lambda: listener.mode is wakeup.WakeupMode.LISTENING, timeout=10, what="wake-ups proven")
        listener.rest_on(other.lanes.quiet_kinds(), other.lanes.full_kinds())
        wait_for(lambda: listener.rest_locks.held_ending == {kind}, timeout=10, what="the ending lock held")
        assert listener.rest_locks.held == set()  # enqueues of it need not notify
        assert other.lanes.claim_due(None)[0] == 0  # asked once more (on_held): still full
        assert other.lanes.claim_due(None)[0] == 0  # resting again
        transitions.finish_done(holder.handed_out)  # the other runner's attempt ends
        wait_for(lambda: other.lanes.claim_due(None)[0] == 1, timeout=10, what="the waiting row claimed")
        listener.rest_on(other.lanes.quiet_kinds(), other.lanes.full_kinds())  # it found work
        wait_for(
            lambda: listener.rest_locks.held_ending == set(), timeout=10, what="the ending lock released"
        )
    finally:
        listener.stop()


@pytest.mark.postgresql
def test_an_ending_lock_waits_for_an_open_end_of_its_kind_then_the_kind_is_asked_again(
    full_kind: tuple[BusyLane, BusyLane, str],
) -> None:
    """An end whose trigger ran before the ending lock was held sent no NOTIFY; taking
    the lock waits for its commit, then the kind is asked again and finds the slot free."""
    from django.db import transaction

    from nexus_workflows.deferred.rest_locks import RestLocks

    holder, other, kind = full_kind
    locks = RestLocks(on_held=other.lanes.wake_limited)
    assert locks.want(other.lanes.quiet_kinds(), other.lanes.full_kinds())
    with raw_connection() as listener:
        with transaction.atomic():
            transitions.finish_done(holder.handed_out)  # its trigger: nobody rests the kind
            locks.settle(listener, listening=True)  # waits 0.1 s for the open end, gives up
            assert locks.held_ending == set()
        assert other.lanes.claim_due(None)[0] == 0  # committed, no NOTIFY: still resting
        locks.settle(listener, listening=True)  # the listener's next turn
        assert locks.held_ending == {kind}
    assert other.lanes.claim_due(None)[0] == 1  # on_held woke the kind


def claim_counting_queries(busy: BusyLane) -> tuple[int, int]:
    """One claim turn of the busy lane: (rows claimed, queries made)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        claimed = busy.lanes.claim_due(None)[0]
    return claimed, len(queries)


@pytest.fixture
def keys_busy(register_workflow: Any, long_rest: None) -> tuple[BusyLane, BusyLane, str]:
    """Two busy runners' lanes of a serial-key kind: the first runs the row "a1" of key a,
    the second found only "a2" due (key a busy) and rests."""
    kind = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: t["to"]).kind
    enqueue(kind, {"key": "a1", "to": "a"})
    holder, other = BusyLane([kind]), BusyLane([kind])
    assert holder.lanes.claim_due(None)[0] == 1
    enqueue(kind, {"key": "a2", "to": "a"})
    claimed, asked = claim_counting_queries(other)
    assert (claimed, asked > 0) == (0, True)
    return holder, other, kind


@pytest.mark.needs("partial_indexes")
def test_a_serial_key_kind_whose_due_rows_wait_behind_busy_keys_rests(
    keys_busy: tuple[BusyLane, BusyLane, str],
) -> None:
    """No query while it rests; it wants both locks (an end frees a key, a row of a free
    key can start), and a wake-up naming the kind (such a row) ends the rest."""
    _holder, other, kind = keys_busy
    for _ in range(3):
        assert claim_counting_queries(other) == (0, 0)
    assert other.lanes.full_kinds() == {kind}
    assert other.lanes.quiet_kinds() == {kind}
    work_id = int(enqueue(kind, {"key": "b1", "to": "b"}) or 0)
    other.lanes.new_work(work_id, kind)  # the listener, on that enqueue's NOTIFY
    assert other.lanes.claim_due(None)[0] == 1
    assert [item.id for item in other.handed_out] == [work_id]


@pytest.mark.needs("partial_indexes")
def test_a_serial_key_kind_resting_behind_busy_keys_is_asked_when_a_delayed_row_of_a_free_key_comes_due(
    register_workflow: Any, long_rest: None
) -> None:
    """Nothing announces a delayed row coming due: while due rows wait behind busy keys,
    the rest ends when the first delayed row of a key not running comes due."""
    kind = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: t["to"]).kind
    enqueue(kind, {"key": "a1", "to": "a"})
    holder, other = BusyLane([kind]), BusyLane([kind])
    assert holder.lanes.claim_due(None)[0] == 1  # key a busy from now on
    enqueue(kind, {"key": "a2", "to": "a"})  # due, behind a1
    enqueue(kind, {"key": "b1", "to": "b"}, delay=3.0)  # key b free, due in 3 s
    assert other.lanes.claim_due(None)[0] == 0
    flow = other.lanes.claimers[next(iter(other.lanes.claimers))].flow
    assert flow is not None
    assert flow.retry_in is not None  # an idle runner looks again then, too
    assert 0 < flow.retry_in <= 3.0
    assert claim_counting_queries(other) == (0, 0)  # resting
    wait_for(lambda: other.lanes.claim_due(None)[0] == 1, timeout=15, what="b1 claimed once due")
    assert [item.trigger["key"] for item in other.handed_out] == ["b1"]


@pytest.mark.needs("partial_indexes")
def test_a_serial_key_kinds_rest_ends_when_an_attempt_ends(keys_busy: tuple[BusyLane, BusyLane, str]) -> None:
    holder, other, kind = keys_busy
    assert claim_counting_queries(other) == (0, 0)
    transitions.finish_done(holder.handed_out)
    other.lanes.wake_limited(kind)  # its own attempt's end, or another runner's NOTIFY
    assert other.lanes.claim_due(None)[0] == 1  # "a2"


@pytest.mark.postgresql
def test_an_attempt_of_a_serial_key_ending_notifies_while_a_runner_holds_the_kinds_ending_lock(
    keys_busy: tuple[BusyLane, BusyLane, str],
) -> None:
    holder, _other, kind = keys_busy
    with raw_connection() as listener, raw_connection() as sender, raw_connection() as resting:
        postgresql.listen(listener, CHANNEL)
        postgresql.hold_rest_lock(resting, kind, lock_timeout=5, lock_class=postgresql.ENDING_LOCK_CLASS)
        (first,) = holder.handed_out
        transitions.finish_done([first])
        sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    assert payloads == [f"ended {kind}", "marker"]


@pytest.mark.postgresql
def test_an_end_while_another_end_of_the_kind_is_open_notifies_though_nobody_rests_it(
    register_workflow: Any,
) -> None:
    """The trigger's lock is taken exclusively by the first end of the kind until its
    transaction ends: a second end meanwhile cannot take it and notifies, whether or not
    a runner rests the kind (a wake-up of every listening runner, which claims once more
    and finds what there is). The README says so."""
    kind = register_workflow(noop, retry_schedule=[1], concurrency=2).kind
    enqueue(kind, {"key": "first"})
    enqueue(kind, {"key": "second"})
    holder = BusyLane([kind])
    assert holder.lanes.claim_due(None)[0] == 2
    first, second = holder.handed_out
    table = DeferredWork._meta.db_table
    with raw_connection() as listener, raw_connection() as sender, raw_connection() as ending:
        postgresql.listen(listener, CHANNEL)
        ending.execute("BEGIN")
        ending.execute(f"UPDATE {table} SET status = 'done' WHERE id = %s", [first.id])  # nobody rests
        transitions.finish_done([second])  # the first end's transaction holds the lock
        ending.execute("COMMIT")
        sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    assert payloads == [f"ended {kind}", "marker"]

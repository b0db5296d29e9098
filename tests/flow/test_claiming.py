"""The flow claim in one process: what a claim may take, decided by the database."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.checks import check_flow_limits_guarded
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.transitions import finish_done, release, reschedule
from nexus_workflows.flow.claiming import window_name
from nexus_workflows.flow.windows import busy_count
from nexus_workflows.models import DeferredWork, Status

pytestmark = pytest.mark.django_db(transaction=True)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def claimer(*kinds: str) -> Claimer:
    return Claimer(kinds=list(kinds), using="default")


def test_concurrency_caps_processing_rows_and_slots_come_back_when_the_attempt_ends(
    register_workflow: Any,
) -> None:
    kind = register_workflow(noop, retry_schedule=[1], concurrency=2).kind
    enqueue_many(kind, [{"key": n} for n in range(5)])
    first = claimer(kind).claim_due(10)
    assert len(first) == 2
    held = DeferredWork.objects.filter(status=Status.PROCESSING).values_list("flow_slot", flat=True)
    assert sorted(held) == [0, 1]
    assert claimer(kind).claim_due(10) == []  # no row is claimed to wait for a slot
    finish_done(first[:1])
    second = claimer(kind).claim_due(10)
    assert len(second) == 1
    release(second)
    assert len(claimer(kind).claim_due(10)) == 1


def test_startable_bounds_limited_kinds_but_not_plain_ones(register_workflow: Any) -> None:
    limited = register_workflow(noop, retry_schedule=[1], concurrency=10).kind
    plain = register_workflow(noop, retry_schedule=[1]).kind
    enqueue_many(limited, [{"key": n} for n in range(5)])
    enqueue_many(plain, [{"key": n} for n in range(5)])
    works = claimer(limited, plain).claim_due(8, startable=2)
    kinds = [work.kind for work in works]
    assert kinds.count(limited) == 2
    assert kinds.count(plain) == 5


def test_the_database_refuses_a_second_holder_of_a_slot_or_the_check_refuses_caps(
    register_workflow: Any,
) -> None:
    """PostgreSQL and SQLite refuse a second holder (a partial unique index). MySQL and
    MariaDB have no partial index, so nothing does: the second holder is written, which
    is why the system check refuses caps and serial keys there (E009)."""
    kind = register_workflow(noop, retry_schedule=[1], concurrency=2).kind
    enqueue_many(kind, [{"key": n} for n in range(2)])
    (work,) = claimer(kind).claim_due(1)
    other = DeferredWork.objects.exclude(pk=work.id).get()
    slot = DeferredWork.objects.get(pk=work.id).flow_slot
    second_holder = DeferredWork.objects.filter(pk=other.pk)
    if connection.features.supports_partial_indexes:
        with pytest.raises(IntegrityError), transaction.atomic():
            second_holder.update(status=Status.PROCESSING, flow_slot=slot)
        assert not check_flow_limits_guarded()
    else:
        assert second_holder.update(status=Status.PROCESSING, flow_slot=slot) == 1
        holders = DeferredWork.objects.filter(kind=kind, status=Status.PROCESSING, flow_slot=slot)
        assert holders.count() == 2
        assert [m.id for m in check_flow_limits_guarded() if repr(kind) in m.msg] == ["nexus_workflows.E009"]


def test_serial_key_runs_one_per_key_earliest_first(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: t["to"]).kind
    ids = [enqueue(kind, {"key": n, "to": "A" if n < 3 else "B"}) for n in range(5)]
    works = claimer(kind).claim_due(10)
    assert sorted(int(w.id) for w in works) == [int(ids[0]), int(ids[3])]
    assert claimer(kind).claim_due(10) == []
    finish_done([w for w in works if w.id == int(ids[0])])
    (next_a,) = claimer(kind).claim_due(10)
    assert next_a.id == int(ids[1])


def test_serial_key_none_means_no_key_and_keys_are_stored_as_hashes(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: t.get("to")).kind
    enqueue_many(kind, [{"key": n} for n in range(3)] + [{"key": 9, "to": "+5215555550000"}])
    row = DeferredWork.objects.get(dedupe_key="9")
    assert "5555" not in row.serial_key_hash
    assert len(row.serial_key_hash) == 64
    assert len(claimer(kind).claim_due(10)) == 4


def test_serial_key_unordered_lets_a_later_item_pass_one_waiting_for_its_retry(
    register_workflow: Any,
) -> None:
    kind = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: "same").kind
    first, second = enqueue(kind, {"key": 1}), enqueue(kind, {"key": 2})
    (work,) = claimer(kind).claim_due(10)
    assert work.id == int(first)
    assert reschedule(work, delay=__import__("datetime").timedelta(minutes=1), error="x")
    (work,) = claimer(kind).claim_due(10)
    assert work.id == int(second)


def test_ordered_waits_for_every_earlier_item_and_abandoned_ones_stop_holding_back(
    register_workflow: Any,
) -> None:
    from datetime import timedelta

    kind = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: "same", ordered=True).kind
    first, second = enqueue(kind, {"key": 1}), enqueue(kind, {"key": 2})
    (work,) = claimer(kind).claim_due(10)
    assert reschedule(work, delay=timedelta(minutes=1), error="x")
    assert claimer(kind).claim_due(10) == []  # the first waits for its retry: the second waits too
    DeferredWork.objects.filter(pk=first).update(status=Status.ABANDONED)
    (work,) = claimer(kind).claim_due(10)
    assert work.id == int(second)


def test_rate_limit_counts_starts_in_the_window(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(3, 60)).kind
    enqueue_many(kind, [{"key": n} for n in range(5)])
    works = claimer(kind).claim_due(10)
    assert len(works) == 3
    finish_done(works)
    assert claimer(kind).claim_due(10) == []  # finishing gives no start back
    assert busy_count(window_name(kind), "", 3, 60, using="default") == 3


def test_rate_key_gives_each_key_its_own_window(register_workflow: Any) -> None:
    kind = register_workflow(
        noop, retry_schedule=[1], rate_limit=(1, 60), rate_key=lambda t: t["sender"]
    ).kind
    enqueue_many(kind, [{"key": n, "sender": "s1" if n < 3 else "s2"} for n in range(5)])
    works = claimer(kind).claim_due(10)
    assert len(works) == 2
    assert claimer(kind).claim_due(10) == []


def test_everything_combined_on_one_kind(register_workflow: Any) -> None:
    kind = register_workflow(
        noop, retry_schedule=[1], concurrency=3, serial_key=lambda t: t["to"], rate_limit=(4, 60)
    ).kind
    enqueue_many(kind, [{"key": n, "to": str(n % 2)} for n in range(10)])
    works = claimer(kind).claim_due(10)
    assert len(works) == 2  # two keys
    finish_done(works)
    works = claimer(kind).claim_due(10)
    assert len(works) == 2  # rate: 4 starts in the window
    finish_done(works)
    assert claimer(kind).claim_due(10) == []


def test_a_reclaim_keeps_its_slot_and_takes_a_start(register_workflow: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    kind = register_workflow(noop, retry_schedule=[1, 1], concurrency=1, rate_limit=(2, 60)).kind
    enqueue_many(kind, [{"key": n} for n in range(3)])
    (work,) = claimer(kind).claim_due(10)
    # The attempt had started (its prepare ran) when its runner died: the reclaim counts it.
    DeferredWork.objects.filter(pk=work.id).update(
        heartbeat_at=timezone.now() - timedelta(hours=1), started_at=timezone.now() - timedelta(hours=1)
    )
    assert claimer(kind).claim_due(10) == []  # the dead runner's slot is still held
    (again,) = claimer(kind).claim_stale(10, stale_after=timedelta(minutes=5))
    assert again.id == work.id
    assert again.attempt == 1
    assert again.lost_started
    assert DeferredWork.objects.get(pk=work.id).flow_slot == 0
    DeferredWork.objects.filter(pk=work.id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    assert claimer(kind).claim_stale(10, stale_after=timedelta(minutes=5)) == []  # rate: 2 used


def window_rows(kind: str) -> Any:
    from nexus_workflows.models import FlowWindowSlot

    return FlowWindowSlot.objects.filter(name=window_name(kind))


def test_a_claim_reserves_a_start_and_the_attempt_takes_it_when_it_starts(register_workflow: Any) -> None:
    from nexus_workflows.clock import database_now
    from nexus_workflows.flow import starts

    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(2, 60)).kind
    enqueue_many(kind, [{"key": n} for n in range(3)])
    works = claimer(kind).claim_due(10)
    assert len(works) == 2
    # Reserved, not started: stamped in the future, so nobody else can take them.
    assert window_rows(kind).filter(started_at__gt=database_now("default")).count() == 2
    assert claimer(kind).claim_due(10) == []
    before = database_now("default")
    starts.begin(works[0])
    assert works[0].reservation is None
    row = DeferredWork.objects.get(pk=works[0].id)
    assert row.started_at is not None
    assert row.started_at >= before
    # The window counts the attempt's own start: the very stamp of its started_at.
    assert window_rows(kind).filter(started_at=row.started_at).count() == 1
    assert window_rows(kind).filter(started_at__gt=database_now("default")).count() == 1
    starts.begin(works[0])  # a second call has nothing left to take
    assert window_rows(kind).filter(started_at=row.started_at).count() == 1
    # Once prepare is known to run (its start marker, or its end), the row counts the
    # start from then: later than the database's stamp, never earlier.
    starts.confirm(works[:1])
    assert works[0].window_start is None
    assert not window_rows(kind).filter(started_at=row.started_at).exists()
    confirmed = window_rows(kind).filter(started_at__lte=database_now("default")).get()
    assert confirmed.started_at > row.started_at
    assert DeferredWork.objects.get(pk=works[0].id).started_at == row.started_at


def test_a_released_claim_gives_its_reserved_start_back(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(2, 60)).kind
    enqueue_many(kind, [{"key": n} for n in range(3)])
    works = claimer(kind).claim_due(10)
    assert len(works) == 2
    release(works[:1])  # a shutdown before the attempt started: no start was counted
    assert len(claimer(kind).claim_due(10)) == 1
    assert claimer(kind).claim_due(10) == []


def test_a_lapsed_reservation_starts_on_a_free_row_or_not_at_all(register_workflow: Any) -> None:
    from datetime import timedelta

    from nexus_workflows.clock import database_now
    from nexus_workflows.exceptions import RateLimitTimeout
    from nexus_workflows.flow import starts

    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(1, 60)).kind
    enqueue_many(kind, [{"key": n} for n in range(2)])
    (first,) = claimer(kind).claim_due(10)
    # The hand-off outlived the reservation and another runner's attempt started on the
    # row meanwhile: there is no free start, and the attempt must not start.
    window_rows(kind).update(started_at=database_now("default") - timedelta(seconds=1))
    with pytest.raises(RateLimitTimeout, match="lapsed before the attempt started"):
        starts.begin(first)
    assert DeferredWork.objects.get(pk=first.id).started_at is None  # nothing written
    # Once the row is free again, the late attempt takes it as a start of its own.
    window_rows(kind).update(started_at=database_now("default") - timedelta(seconds=61))
    starts.begin(first)
    stamp = DeferredWork.objects.get(pk=first.id).started_at
    assert window_rows(kind).get().started_at == stamp


def advisory_lock_waiters() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0]


@pytest.mark.postgresql
@pytest.mark.parametrize("first_by", ["enqueue", "enqueue_many"])
def test_ordered_items_of_a_key_take_their_place_by_commit_not_by_insert(
    register_workflow: Any, first_by: str
) -> None:
    """Two enqueues of one key whose transactions overlap: the one that commits first is
    the earlier-enqueued. The second waits for the first to commit before it inserts, so
    it cannot take a lower id, nor commit first and start before the first is visible."""
    import threading

    from django.db import connections

    from tests.processes import wait_for

    kind = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: t["to"], ordered=True).kind
    second: dict[str, Any] = {}

    def enqueue_second() -> None:
        try:
            with transaction.atomic():
                second["id"] = enqueue(kind, {"key": "second", "to": "p"})
        finally:
            connections.close_all()

    thread = threading.Thread(target=enqueue_second)
    with transaction.atomic():
        if first_by == "enqueue":
            first_id = enqueue(kind, {"key": "first", "to": "p"})
        else:
            (first_id, _) = enqueue_many(kind, [{"key": "first", "to": "p"}, {"key": "other", "to": "q"}])
        thread.start()
        # The second enqueue waits for our commit: it has not inserted anything.
        wait_for(lambda: advisory_lock_waiters() == 1, timeout=30, what="the second enqueue to wait")
        assert "id" not in second
    thread.join(30)
    assert int(first_id) < int(second["id"])
    works = claimer(kind).claim_due(10)
    assert [work.id for work in works if work.dedupe_key != "other"] == [int(first_id)]
    finish_done(works)
    (after,) = claimer(kind).claim_due(10)
    assert after.id == int(second["id"])


def test_enqueues_of_keys_on_sqlite_and_elsewhere_need_no_lock(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: t["to"], ordered=True).kind
    ids = [int(enqueue(kind, {"key": n, "to": "p"})) for n in range(3)]
    ids += [int(pk) for pk in enqueue_many(kind, [{"key": n, "to": "p"} for n in range(3, 6)])]
    assert ids == sorted(ids)
    for expected in ids:
        (work,) = claimer(kind).claim_due(10)
        assert work.id == expected
        finish_done([work])


def test_stale_work_of_limited_kinds_is_reclaimed_only_as_far_as_threads_are_free(
    register_workflow: Any,
) -> None:
    """A reclaim holds the row's slot, key and rate-window start: queued behind busy
    threads, its reserved start would lapse. Plain kinds are not bounded so."""
    from collections import Counter
    from datetime import timedelta

    from django.db.models.functions import Now

    limited = register_workflow(noop, retry_schedule=[1], rate_limit=(10, 60)).kind
    plain = register_workflow(noop, retry_schedule=[1]).kind
    for kind in (limited, plain):
        enqueue_many(kind, [{"key": n} for n in range(3)])
    DeferredWork.objects.update(
        status=Status.PROCESSING, claim_token="dead-runner", heartbeat_at=Now() - timedelta(hours=1)
    )
    stale = claimer(limited, plain).claim_stale(10, stale_after=timedelta(minutes=5), startable=1)
    assert Counter(work.kind for work in stale) == {limited: 1, plain: 3}


def test_after_a_deploy_lowers_the_cap_runners_reading_at_once_are_offered_one_number(
    register_workflow: Any,
) -> None:
    # The old deploy's cap was 8: three rows still run holding slots 5, 6, 7; the new cap
    # is 4, so one more may start. Runners that read the free slots at the same time must
    # be offered the same number, so that the unique index lets only one of them claim
    # it (offered 0-3 at random, two runners took two: five ran; seen with threads).
    kind = register_workflow(noop, retry_schedule=[1], concurrency=4).kind
    enqueue_many(kind, [{"key": n} for n in range(6)])
    ids = DeferredWork.objects.order_by("pk").values_list("pk", flat=True)
    for slot, pk in zip((5, 6, 7), ids, strict=False):
        DeferredWork.objects.filter(pk=pk).update(status=Status.PROCESSING, flow_slot=slot)
    flow = claimer(kind).flow
    assert flow is not None
    offered = {tuple(flow.free_slots(kind, 4)) for _ in range(20)}
    assert offered == {(0,)}
    assert len(claimer(kind).claim_due(10)) == 1
    assert claimer(kind).claim_due(10) == []
    # A row claimed before the kind had a cap holds no number: it counts the same way.
    DeferredWork.objects.filter(flow_slot=5).update(flow_slot=None)
    assert flow.free_slots(kind, 4) == []


def test_a_start_whose_claim_was_lost_gives_its_reserved_start_back(register_workflow: Any) -> None:
    """The start was undone with its transaction and the reservation held a start of the
    window for RESERVED_FOR (30 s) that no attempt took."""
    from nexus_workflows.clock import database_now
    from nexus_workflows.exceptions import ClaimLost
    from nexus_workflows.flow import starts

    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(1, 60)).kind
    enqueue_many(kind, [{"key": n} for n in range(2)])
    (work,) = claimer(kind).claim_due(10)
    DeferredWork.objects.filter(pk=work.id).update(claim_token="another-runner")
    with pytest.raises(ClaimLost):
        starts.begin(work)
    assert work.reservation is None
    assert not window_rows(kind).filter(started_at__gt=database_now("default")).exists()
    assert len(claimer(kind).claim_due(10)) == 1  # the window's one start is free again


def test_a_reclaim_found_lost_by_its_guard_gives_its_reserved_start_back(register_workflow: Any) -> None:
    """Another runner finished (or reclaimed) the row between this reclaim and its guard's
    write: the reclaim's reserved start held a row of the window for 30 s."""
    from datetime import timedelta

    from django.utils import timezone

    from nexus_workflows.clock import database_now
    from nexus_workflows.deferred.runner.reclaim import guard_crash_loop
    from nexus_workflows.deferred.runner.stats import RunStats, Tally
    from nexus_workflows.observability.observer import Observer

    kind = register_workflow(noop, retry_schedule=[1, 1], rate_limit=(1, 60)).kind
    enqueue_many(kind, [{"key": n} for n in range(2)])
    (work,) = claimer(kind).claim_due(1)
    long_ago = timezone.now() - timedelta(hours=1)
    DeferredWork.objects.filter(pk=work.id).update(heartbeat_at=long_ago, started_at=long_ago)
    window_rows(kind).update(started_at=database_now("default") - timedelta(seconds=61))  # free
    (again,) = claimer(kind).claim_stale(10, stale_after=timedelta(minutes=5))
    assert again.reservation is not None
    DeferredWork.objects.filter(pk=work.id).update(status=Status.DONE, claim_token=work.claim_token)
    tally = Tally(RunStats(), Observer(kinds=[kind], concurrency=1, using="default", in_flight=lambda: 0))

    assert not guard_crash_loop(again, tally)

    assert tally.stats.lost == 1
    assert not window_rows(kind).filter(started_at__gt=database_now("default")).exists()
    assert len(claimer(kind).claim_due(10)) == 1

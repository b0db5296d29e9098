"""Claims and the fence on every later write, judged by rows matched."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from nexus_workflows import ClaimLost, InvalidCheckpoint, enqueue, sql
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.transitions import (
    abandon,
    finish_done,
    heartbeat,
    mark_started,
    release,
    reschedule,
    save_checkpoints,
)
from nexus_workflows.json_values import MAX_DEPTH
from nexus_workflows.models import DeferredWork, Status
from tests.json_like import nested
from tests.testapp import tasks
from tests.threads import run_together

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def kind(register_workflow: Any) -> str:
    return register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind


def claimer(kind: str) -> Claimer:
    return Claimer(kinds=[kind], using="default")


def test_claim_due_takes_due_pending_rows_only(kind: str, register_workflow: Any) -> None:
    other_kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    due = enqueue(kind, {"key": "due"})
    enqueue(kind, {"key": "later"}, delay=3600)
    enqueue(other_kind, {"key": "other"})
    done = enqueue(kind, {"key": "done"})
    DeferredWork.objects.filter(pk=done).update(status=Status.DONE)

    claimed = claimer(kind).claim_due(10)
    assert [work.id for work in claimed] == [int(due)]
    work = DeferredWork.objects.get(pk=due)
    assert work.status == Status.PROCESSING
    assert work.claim_token == claimed[0].claim_token != ""
    assert work.heartbeat_at is not None
    assert claimer(kind).claim_due(10) == []  # claimed work is not claimed again


def test_claim_due_respects_the_limit_and_the_order(kind: str) -> None:
    ids = [enqueue(kind, {"key": str(n)}, delay=0) for n in range(5)]
    for offset, work_id in enumerate(ids):
        DeferredWork.objects.filter(pk=work_id).update(
            next_attempt_at=timezone.now() - timedelta(minutes=10 - offset)
        )
    first = claimer(kind).claim_due(2)
    assert [work.id for work in first] == [int(ids[0]), int(ids[1])]


def test_concurrent_claimers_never_share_a_row(kind: str) -> None:
    for number in range(300):
        enqueue(kind, {"key": str(number)})

    def claim_until_empty(slot: int) -> list[int]:
        mine, claimed, misses = claimer(kind), [], 0
        while misses < 3:
            works = mine.claim_due(7)
            claimed.extend(work.id for work in works)
            misses = 0 if works else misses + 1
        return claimed

    everything = [work_id for ids in run_together(claim_until_empty, 4, timeout=60) for work_id in ids]
    assert len(everything) == 300
    assert len(set(everything)) == 300
    assert DeferredWork.objects.filter(status=Status.PROCESSING).count() == 300


def test_save_merges_durably_and_a_lost_claim_writes_nothing(kind: str) -> None:
    work_id = enqueue(kind, {"key": "a"})
    (work,) = claimer(kind).claim_due(1)
    assert save_checkpoints(work, {"a": 1}) == {"a": 1}
    save_checkpoints(work, {"b": [1, 2]})
    assert DeferredWork.objects.get(pk=work_id).checkpoints == {"a": 1, "b": [1, 2]}

    # An operator (or another runner) takes the row away from this claim.
    DeferredWork.objects.filter(pk=work_id).update(claim_token="someone-else")
    with pytest.raises(ClaimLost, match=f"#{work_id}: this attempt no longer holds the work"):
        save_checkpoints(work, {"c": 3})
    assert DeferredWork.objects.get(pk=work_id).checkpoints == {"a": 1, "b": [1, 2]}


def test_rewriting_an_unchanged_checkpoint_is_not_a_lost_claim(kind: str) -> None:
    enqueue(kind, {"key": "a"})
    (work,) = claimer(kind).claim_due(1)
    save_checkpoints(work, {"a": 1})
    save_checkpoints(work, {"a": 1})  # matched, though nothing changed


@pytest.mark.parametrize(
    ("patch", "rule"),
    [
        (["not", "a", "dict"], "takes a dict"),
        ({1: "int key"}, "string checkpoint names"),
        ({"x": object()}, "JSON values only"),
        ({"x": float("nan")}, "JSON values only"),
        ({"x": -0.0}, "JSON values only, ones that come back exactly: the patch contains -0.0"),
        ({"x": 1e20}, "1e16 or more"),
        ({"x": "\ud800"}, "not valid Unicode"),
        ({"x": "a\x00"}, "NUL character"),
        ({"x": nested(MAX_DEPTH + 1)}, "nested more than"),
        ({"x": (1, 2)}, "type tuple"),
    ],
)
def test_bad_patches_are_rejected_before_writing(kind: str, patch: Any, rule: str) -> None:
    work_id = enqueue(kind, {"key": "a"})
    (work,) = claimer(kind).claim_due(1)
    with pytest.raises(InvalidCheckpoint, match=rule):
        save_checkpoints(work, patch)
    assert DeferredWork.objects.get(pk=work_id).checkpoints == {}


def test_a_patch_as_deep_as_the_database_keeps_is_saved_and_a_deeper_one_refused(kind: str) -> None:
    """64 containers, or 31 on MariaDB, the most its JSON documents nest: a deeper journal
    was refused by the database's CHECK (an IntegrityError out of save())."""
    depth = sql.json_depth("default")
    work_id = enqueue(kind, {"key": "a"})
    (work,) = claimer(kind).claim_due(1)
    save_checkpoints(work, {"x": nested(depth - 1)})
    assert DeferredWork.objects.get(pk=work_id).checkpoints == {"x": nested(depth - 1)}
    with pytest.raises(InvalidCheckpoint, match=f"nested more than {depth} containers deep"):
        save_checkpoints(work, {"y": nested(depth)})
    assert DeferredWork.objects.get(pk=work_id).checkpoints == {"x": nested(depth - 1)}


def test_a_stale_workers_late_writes_change_nothing(kind: str) -> None:
    work_id = enqueue(kind, {"key": "a"})
    (old,) = claimer(kind).claim_due(1)
    save_checkpoints(old, {"step": 1})
    # The old worker stops heart-beating; another runner reclaims the work.
    DeferredWork.objects.filter(pk=work_id).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    (new,) = claimer(kind).claim_stale(5, stale_after=timedelta(minutes=5))
    assert new.reclaimed
    assert new.attempt == 1
    assert new.checkpoints == {"step": 1}
    snapshot = DeferredWork.objects.filter(pk=work_id).values().get()

    with pytest.raises(ClaimLost):
        save_checkpoints(old, {"step": 2})
    assert finish_done([old]) == ([], [old])
    assert reschedule(old, delay=timedelta(minutes=1), error="Late: error") is False
    assert abandon(old, error="Late: error", reason="late") is False
    assert release([old]) == 0
    assert heartbeat([old], using="default") == set()
    assert DeferredWork.objects.filter(pk=work_id).values().get() == snapshot

    # The new claim's writes go through.
    assert finish_done([new]) == ([new], [])
    assert DeferredWork.objects.get(pk=work_id).status == Status.DONE
    # The row is done, but not by the old claim: its late done is still lost.
    assert finish_done([old]) == ([], [old])


def test_finish_done_tells_written_rows_from_lost_ones(kind: str) -> None:
    ids = [enqueue(kind, {"key": str(n)}) for n in range(3)]
    works = claimer(kind).claim_due(3)
    DeferredWork.objects.filter(pk=ids[1]).update(claim_token="stolen")
    written, lost = finish_done(works)
    assert sorted(work.id for work in written) == [int(ids[0]), int(ids[2])]
    assert [work.id for work in lost] == [int(ids[1])]
    assert DeferredWork.objects.get(pk=ids[1]).status == Status.PROCESSING


@pytest.mark.parametrize("returning", [True, False], ids=["update-returning", "update-then-read"])
def test_a_done_written_again_by_its_own_claim_is_written_not_lost(
    kind: str, monkeypatch: Any, returning: bool
) -> None:
    """A done whose commit's answer was lost (an outage) is written again: it matches
    nothing then, yet the work was done by this claim, not taken over."""
    from nexus_workflows.deferred import transitions

    if not returning:
        monkeypatch.setattr(transitions, "can_return_from_update", lambda using: False)
    ids = [int(enqueue(kind, {"key": str(n)})) for n in range(4)]
    works = sorted(claimer(kind).claim_due(4), key=lambda work: work.id)
    works[3].history_changed = True  # a reclaimed row's done: written on its own
    assert finish_done([works[0], works[3]])[1] == []
    DeferredWork.objects.filter(pk=ids[2]).update(claim_token="stolen")

    written, lost = finish_done(works)  # the retry, with the rest of the batch
    assert sorted(work.id for work in written) == [ids[0], ids[1], ids[3]]
    assert [work.id for work in lost] == [ids[2]]
    row = DeferredWork.objects.get(pk=ids[0])
    assert (row.status, row.claim_token) == (Status.DONE, works[0].claim_token)


def test_claim_stale_counts_the_lost_attempt_only_if_it_had_started(kind: str) -> None:
    fresh = enqueue(kind, {"key": "fresh"})
    started = enqueue(kind, {"key": "started"})
    unstarted = enqueue(kind, {"key": "unstarted"})
    held = claimer(kind).claim_due(3)
    assert mark_started([w for w in held if w.id == int(started)], using="default") == {int(started)}
    DeferredWork.objects.filter(pk__in=[started, unstarted]).update(
        heartbeat_at=timezone.now() - timedelta(minutes=6)
    )
    works = {work.id: work for work in claimer(kind).claim_stale(10, stale_after=timedelta(minutes=5))}
    assert set(works) == {int(started), int(unstarted)}
    rows = {row.pk: row for row in DeferredWork.objects.all()}
    assert (rows[int(started)].attempt, rows[int(started)].lost_unstarted) == (1, 0)
    assert (rows[int(unstarted)].attempt, rows[int(unstarted)].lost_unstarted) == (0, 1)
    assert (rows[int(fresh)].attempt, rows[int(fresh)].lost_unstarted) == (0, 0)
    assert rows[int(started)].started_at is None  # the new attempt has not started
    assert works[int(started)].lost_started
    assert not works[int(unstarted)].lost_started
    assert works[int(started)].history[-1] == {
        **works[int(started)].history[-1],
        "outcome": "lost",
        "attempt": 0,
        "started": True,
    }
    assert works[int(unstarted)].history[-1] == {
        **works[int(unstarted)].history[-1],
        "outcome": "lost",
        "attempt": 0,
        "started": False,
    }


def test_worker_ids_and_first_start_follow_attempts_not_claims() -> None:
    """worker_ids (a Django task's attempts) grows only by claims whose attempt started;
    first_started_at is the first claim's and stays, while started_at is NULL after each."""
    started = tasks.add.enqueue(1, 2).id
    unstarted = tasks.add.enqueue(3, 4).id
    pk = dict(DeferredWork.objects.values_list("dedupe_key", "pk"))
    first = Claimer(kinds=[], queues=["default"], using="default", worker_id="first")
    held = first.claim_due(2)
    assert mark_started([w for w in held if w.id == pk[started]], using="default") == {pk[started]}
    before = {row.pk: row for row in DeferredWork.objects.all()}
    assert all(row.first_started_at is not None for row in before.values())
    DeferredWork.objects.update(heartbeat_at=timezone.now() - timedelta(minutes=6))
    second = Claimer(kinds=[], queues=["default"], using="default", worker_id="second")
    assert len(second.claim_stale(10, stale_after=timedelta(minutes=5))) == 2
    rows = {row.pk: row for row in DeferredWork.objects.all()}
    assert rows[pk[started]].worker_ids == ["first", "second"]
    assert rows[pk[unstarted]].worker_ids == ["second"]  # the lost claim was no attempt
    for row_id in pk.values():
        assert rows[row_id].started_at is None
        assert rows[row_id].first_started_at == before[row_id].first_started_at
        assert rows[row_id].last_attempted_at >= before[row_id].last_attempted_at


@pytest.mark.parametrize("queues", [[], ["default"]], ids=["workflows only", "workflows and tasks"])
def test_a_claim_writes_the_task_columns_of_task_rows_only(kind: str, queues: list[str]) -> None:
    """first_started_at, last_attempted_at and worker_ids are a Django task's TaskResult:
    a claim (fresh or a reclaim) leaves them alone on workflow rows, whether or not its
    runner also takes tasks; task rows taken by the same claim get them."""
    work_id = int(enqueue(kind, {"key": "a"}))
    task_pk = DeferredWork.objects.get(dedupe_key=tasks.add.enqueue(1, 2).id).pk if queues else None
    mine = Claimer(kinds=[kind], queues=queues, using="default", worker_id="me")
    claimed = mine.claim_due(10)
    assert {w.id for w in claimed} == {work_id} | ({task_pk} if task_pk else set())
    mark_started(claimed, using="default")
    DeferredWork.objects.update(heartbeat_at=timezone.now() - timedelta(minutes=6))
    assert len(mine.claim_stale(10, stale_after=timedelta(minutes=5))) == len(claimed)
    workflow = DeferredWork.objects.get(pk=work_id)
    assert (workflow.worker_ids, workflow.first_started_at, workflow.last_attempted_at) == ([], None, None)
    if task_pk is not None:
        task_row = DeferredWork.objects.get(pk=task_pk)
        assert task_row.worker_ids == ["me", "me"]
        assert task_row.first_started_at is not None
        assert task_row.last_attempted_at is not None


def test_a_save_marks_the_attempt_started(kind: str) -> None:
    work_id = enqueue(kind, {"key": "a"})
    (work,) = claimer(kind).claim_due(1)
    assert DeferredWork.objects.get(pk=work_id).started_at is None
    save_checkpoints(work, {"step": 1})
    marked = DeferredWork.objects.get(pk=work_id).started_at
    assert marked is not None
    save_checkpoints(work, {"step": 2})
    assert DeferredWork.objects.get(pk=work_id).started_at == marked  # the first save's time


@pytest.mark.parametrize("returning", [True, False], ids=["update-returning", "read-back-by-token"])
def test_claimed_work_is_the_row_as_the_claim_left_it(kind: str, monkeypatch: Any, returning: bool) -> None:
    """Claims return the rows from the UPDATE (RETURNING) where the database can, else read
    them back by their token; both give the same claimed work."""
    from nexus_workflows.deferred import transitions

    if not returning:
        monkeypatch.setattr(transitions, "can_return_from_update", lambda using: False)
    work_id = enqueue(kind, {"key": "a", "visit": 7})
    earlier = [{"attempt": 0, "outcome": "rescheduled", "error": "Upstream: 503"}]
    DeferredWork.objects.filter(pk=work_id).update(attempt=1, checkpoints={"step": 1}, history=earlier)

    (work,) = claimer(kind).claim_due(10)
    assert (work.id, work.kind, work.dedupe_key, work.attempt) == (int(work_id), kind, "a", 1)
    assert (work.trigger, work.checkpoints, work.history) == ({"key": "a", "visit": 7}, {"step": 1}, earlier)
    assert not work.reclaimed
    assert work.claim_token == DeferredWork.objects.get(pk=work_id).claim_token

    mark_started([work], using="default")
    DeferredWork.objects.filter(pk=work_id).update(heartbeat_at=timezone.now() - timedelta(minutes=6))
    (again,) = claimer(kind).claim_stale(10, stale_after=timedelta(minutes=5))
    assert (again.id, again.attempt, again.reclaimed) == (int(work_id), 2, True)
    assert again.claim_token not in ("", work.claim_token)
    assert again.history[:-1] == earlier
    assert again.history[-1]["outcome"] == "lost"
    assert claimer(kind).claim_due(10) == []


def test_heartbeat_refreshes_held_rows_only(kind: str) -> None:
    enqueue(kind, {"key": "a"})
    enqueue(kind, {"key": "b"})
    held = claimer(kind).claim_due(2)
    long_ago = timezone.now() - timedelta(minutes=10)
    DeferredWork.objects.update(heartbeat_at=long_ago)
    DeferredWork.objects.filter(pk=held[1].id).update(claim_token="other-runner")
    assert heartbeat(held, using="default") == {held[0].id}  # the ids refreshed
    assert DeferredWork.objects.get(pk=held[0].id).heartbeat_at > long_ago
    assert DeferredWork.objects.get(pk=held[1].id).heartbeat_at == long_ago


def test_release_returns_work_to_pending_due_now_with_attempt_unchanged(kind: str) -> None:
    work_id = enqueue(kind, {"key": "a"})
    DeferredWork.objects.filter(pk=work_id).update(attempt=2)
    works = claimer(kind).claim_due(1)
    assert release(works) == 1
    work = DeferredWork.objects.get(pk=work_id)
    assert (work.status, work.attempt, work.claimed_at) == (Status.PENDING, 2, None)
    # The token stays, saying which claim gave it back; no fence matches a pending row.
    assert work.claim_token == works[0].claim_token
    assert not DeferredWork.objects.held(work.claim_token).exists()
    assert work.next_attempt_at <= timezone.now()


@pytest.mark.parametrize("path", ["due", "by-id", "workflow-ids", "many-workflow-ids", "flow-limited"])
def test_rows_keeping_a_limit_their_kind_no_longer_has_are_still_claimed_together(
    register_workflow: Any, path: str
) -> None:
    """Rows enqueued while a kind had a serial key, and rescheduled while it had a cap,
    keep their key hash and slot after a deploy drops those limits; claimed together,
    they would collide in the unique indexes that guard them, on every claim.
    "many-workflow-ids": more ids than the wake-up's precompiled claim takes (and every
    claim by id where the database has no UPDATE … RETURNING): the ORM's claim."""
    before = register_workflow(
        lambda t, c, s: None, retry_schedule=[1], serial_key=lambda t: "one conversation", concurrency=2
    )
    keys = "abcdef" if path == "many-workflow-ids" else "abc"
    ids = [int(enqueue(before.kind, {"key": key})) for key in keys]
    DeferredWork.objects.filter(pk__in=ids).update(flow_slot=0)  # as a reschedule leaves them
    assert len(set(DeferredWork.objects.filter(pk__in=ids).values_list("serial_key_hash", flat=True))) == 1
    registry.unregister(before.kind)
    # The same kind after the deploy: no serial key, no cap (or, last, only a rate limit).
    after = {"rate_limit": (100, 1.0)} if path == "flow-limited" else {}
    register_workflow(lambda t, c, s: None, kind=before.kind, retry_schedule=[1], **after)

    claiming = Claimer(kinds=[before.kind], using="default")
    if path == "by-id":
        claimed = claiming.claim_due_ids(ids)
    elif path in ("workflow-ids", "many-workflow-ids"):
        claimed = claiming.claim_workflow_ids(ids)
    else:
        claimed = claiming.claim_due(10)
    assert sorted(work.id for work in claimed) == ids
    rows = DeferredWork.objects.filter(pk__in=ids)
    claimed_rows = set(rows.values_list("status", "flow_slot", "serial_key_hash"))
    assert claimed_rows == {(Status.PROCESSING, None, None)}


@pytest.mark.mysql
def test_a_claim_on_mariadb_reads_only_pending_entries_of_its_index(register_workflow: Any) -> None:
    """MariaDB has no partial indexes: nw_due_idx holds every row there, and finished rows
    (whose due times are older than any pending row's) come first in its order. Keyed by
    status first, the claim reads the due rows it takes; keyed by priority and due time
    alone it walked every finished row's entry (270,000 rows, 0.53 s, at 300,000)."""
    import json

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    long_ago = timezone.now() - timedelta(days=1)
    DeferredWork.objects.bulk_create(
        DeferredWork(
            kind=kind,
            dedupe_key=f"done-{n}",
            trigger={},
            status=Status.DONE,
            next_attempt_at=long_ago + timedelta(seconds=n),
        )
        for n in range(20_000)
    )
    DeferredWork.objects.bulk_create(
        DeferredWork(kind=kind, dedupe_key=f"due-{n}", trigger={}, next_attempt_at=timezone.now())
        for n in range(2_000)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE TABLE {DeferredWork._meta.db_table}")
        cursor.fetchall()
    with CaptureQueriesContext(connection) as queries:
        assert len(Claimer(kinds=[kind], using="default").claim_due(5)) == 5
    (read,) = [query["sql"] for query in queries.captured_queries if query["sql"].startswith("SELECT")][:1]
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE FORMAT=JSON {read}")
        plan = json.loads(cursor.fetchone()[0])
    examined = sum(_rows_read(plan))
    assert examined < 100, f"the claim read {examined} rows to take 5"


def _rows_read(plan: Any) -> list[float]:
    """The rows each table access of a MariaDB ``ANALYZE FORMAT=JSON`` plan read."""
    if isinstance(plan, list):
        return [rows for item in plan for rows in _rows_read(item)]
    if not isinstance(plan, dict):
        return []
    own = [plan["r_rows"]] if "table_name" in plan and "r_rows" in plan else []
    return own + [rows for value in plan.values() for rows in _rows_read(value)]

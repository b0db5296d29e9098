from __future__ import annotations

import re
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from nexus_workflows import (
    EnqueueError,
    InvalidDedupeKey,
    InvalidEnqueueOption,
    InvalidTrigger,
    UnknownWorkflow,
    WorkflowError,
    enqueue,
    enqueue_many,
)
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.models import DeferredWork, Status
from tests.clock import database_resolution_now
from tests.threads import run_together

pytestmark = pytest.mark.django_db


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


@pytest.fixture
def deferred(register_workflow: Any) -> str:
    return register_workflow(noop, retry_schedule=[1, 5]).kind


def test_dedupe_keys_that_differ_only_in_case_accents_or_trailing_spaces_are_different_work(
    deferred: str,
) -> None:
    """Keys are compared exactly, as PostgreSQL and SQLite compare text. MariaDB's default
    collation (utf8mb4_general_ci) took "maria", "María", "MARIA" and "maria " for one key:
    each later patient's work was deduplicated into the first's, and never ran."""
    keys = ["maria", "María", "MARIA", "maria "]
    ids = [enqueue(deferred, {"key": key}) for key in keys]
    assert len({*ids}) == len(keys)
    stored = [DeferredWork.objects.get(kind=deferred, dedupe_key=key).pk for key in keys]
    assert stored == [int(work_id) for work_id in ids]
    many = enqueue_many(deferred, [{"key": key} for key in ("MARIA", "MARÍA", "maria  ")])
    assert many[0] == ids[2]  # taken: that very key
    assert len({*many, *ids}) == len(keys) + 2


@pytest.mark.mysql  # PostgreSQL and SQLite compare text exactly by themselves
def test_every_text_column_of_the_app_compares_exactly() -> None:
    """On MySQL and MariaDB every table of the app has a binary, NO PAD collation (migration
    0013); one that a later migration creates must get it too."""
    from django.apps import apps

    tables = [model._meta.db_table for model in apps.get_app_config("nexus_workflows").get_models()]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT table_name, collation_name FROM information_schema.columns "
            f"WHERE table_schema = DATABASE() AND collation_name IS NOT NULL "
            f"AND table_name IN ({', '.join(['%s'] * len(tables))})",
            tables,
        )
        found = cursor.fetchall()
    assert {table for table, _ in found} == set(tables)
    assert {collation for _, collation in found} == {"utf8mb4_nopad_bin"}


def test_new_work_is_pending_and_due_now(deferred: str) -> None:
    before = database_resolution_now()
    work_id = enqueue(deferred, {"key": "a", "visit": 7})
    assert isinstance(work_id, str)
    work = DeferredWork.objects.get(pk=int(work_id))
    assert (work.kind, work.dedupe_key, work.status) == (deferred, "a", Status.PENDING)
    assert work.trigger == {"key": "a", "visit": 7}
    assert work.checkpoints == {}
    assert work.attempt == 0
    assert before <= work.next_attempt_at <= timezone.now()


def test_delay_makes_work_due_later(deferred: str) -> None:
    work_id = enqueue(deferred, {"key": "a"}, delay=timedelta(minutes=5))
    work = DeferredWork.objects.get(pk=int(work_id))
    assert work.next_attempt_at > timezone.now() + timedelta(minutes=4)
    other = DeferredWork.objects.get(pk=int(enqueue(deferred, {"key": "b"}, delay=30)))
    assert other.next_attempt_at > timezone.now() + timedelta(seconds=25)


def test_pending_key_returns_its_id_and_keeps_the_first_trigger(deferred: str) -> None:
    first = enqueue(deferred, {"key": "a", "version": 1})
    assert enqueue(deferred, {"key": "a", "version": 2}) == first
    assert DeferredWork.objects.count() == 1
    assert DeferredWork.objects.get().trigger["version"] == 1


@pytest.mark.parametrize("status", [Status.PROCESSING, Status.DONE])
def test_key_in_flight_or_done_returns_none(deferred: str, status: Status) -> None:
    work_id = enqueue(deferred, {"key": "a"})
    DeferredWork.objects.filter(pk=work_id).update(status=status)
    assert enqueue(deferred, {"key": "a"}) is None
    assert DeferredWork.objects.get().status == status


def test_abandoned_key_is_revived_keeping_checkpoints(deferred: str) -> None:
    work_id = enqueue(deferred, {"key": "a", "version": 1})
    DeferredWork.objects.filter(pk=work_id).update(
        status=Status.ABANDONED,
        attempt=2,
        last_error="ValueError: upstream said no",
        checkpoints={"record_id": "rec1"},
        next_attempt_at=timezone.now() + timedelta(days=1),
    )
    assert enqueue(deferred, {"key": "a", "version": 2}) == work_id
    work = DeferredWork.objects.get()
    assert work.status == Status.PENDING
    assert work.attempt == 0
    assert work.last_error == ""
    assert work.next_attempt_at <= timezone.now()
    assert work.checkpoints == {"record_id": "rec1"}
    assert work.trigger["version"] == 1
    assert work.history[-1]["event"] == "revived"


def test_a_revive_by_enqueue_never_overwrites_history_written_since_its_read(
    deferred: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between enqueue's read of an abandoned row and its revive, another enqueue revives
    it, a runner claims it and the attempt is abandoned again. The revive must not write
    the history it read (losing that attempt's entry): it reads the row again."""
    work_id = int(enqueue(deferred, {"key": "a"}))
    DeferredWork.objects.filter(pk=work_id).update(status=Status.ABANDONED, updated_at=timezone.now())
    revive = transitions.revive
    interleaved: list[int] = []

    def changed_first(queryset: Any, **options: Any) -> int:
        if not interleaved:  # what other connections commit between the read and the revive
            interleaved.append(revive(DeferredWork.objects.filter(pk=work_id)))
            (work,) = Claimer(kinds=[deferred], using="default").claim_due(1)
            assert transitions.abandon(work, error="RuntimeError: the second attempt", reason="permanent")
        return revive(queryset, **options)

    monkeypatch.setattr(transitions, "revive", changed_first)
    assert enqueue(deferred, {"key": "a"}) == str(work_id)
    work = DeferredWork.objects.get(pk=work_id)
    assert interleaved == [1]
    assert work.status == Status.PENDING
    assert [entry.get("outcome", entry.get("event")) for entry in work.history] == ["abandoned", "revived"]
    assert "the second attempt" in work.history[0]["error"]


def test_unknown_kind_is_rejected_without_echoing_it(register_workflow: Any) -> None:
    """A caller may pass anything as the kind (patient data in the wrong argument): the
    message says what was given and which kinds exist, never the value."""
    known = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    given = r"for the kind given \(a string of 11 character\(s\)\)"
    with pytest.raises(UnknownWorkflow, match=given) as raised:
        enqueue("María López", {"key": "a"})
    assert "María" not in str(raised.value)
    assert known in str(raised.value)
    assert not DeferredWork.objects.exists()


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        (None, "returned None"),
        ("", "empty or whitespace-only"),
        ("   \t", "empty or whitespace-only"),
        (42, "returned int; it must return a string"),
        (b"bytes", "returned bytes"),
        ("x" * 256, "at most 255"),
        ("a\x00b", "NUL"),
    ],
)
def test_bad_dedupe_keys_are_rejected_and_nothing_is_written(
    register_workflow: Any, key: Any, rule: str
) -> None:
    kind = register_workflow(noop, dedupe_key=lambda trigger: key, retry_schedule=[1]).kind
    with pytest.raises(InvalidDedupeKey, match=rule) as raised:
        enqueue(kind, {"key": "a"})
    assert f"workflow {kind!r}" in str(raised.value)
    assert not DeferredWork.objects.exists()


def test_a_dedupe_key_function_that_raises_is_reported_without_the_trigger(register_workflow: Any) -> None:
    kind = register_workflow(noop, dedupe_key=lambda trigger: trigger["missing"], retry_schedule=[1]).kind
    with pytest.raises(InvalidDedupeKey, match="dedupe_key raised KeyError") as raised:
        enqueue(kind, {"patient": "María López"})
    assert "María" not in str(raised.value)
    # Where it raised, instead of the KeyError itself (see test_enqueue_inputs).
    assert raised.value.__cause__ is None
    assert re.search(r"\(test_enqueueing\.py:\d+ in <lambda>\)", str(raised.value))


class Opaque:
    pass


@pytest.mark.parametrize(
    ("trigger", "rule"),
    [
        ({"key": "a", "when": timezone.now()}, "found a value of type datetime"),
        ({"key": "a", "object": Opaque()}, "found a value of type Opaque"),
        ({"key": "a", "ratio": float("nan")}, "NaN or infinity"),
        ({"key": "a", "ratio": float("inf")}, "NaN or infinity"),
        ({"key": "a", ("tuple", "key"): 1}, "dict key of type tuple; keys must be strings"),
        ({"key": "a", "text": "nul\x00byte"}, "NUL character"),
    ],
)
def test_triggers_that_are_not_json_are_rejected(deferred: str, trigger: Any, rule: str) -> None:
    with pytest.raises(InvalidTrigger, match=rule) as raised:
        enqueue(deferred, trigger)
    assert f"workflow {deferred!r}" in str(raised.value)
    assert not DeferredWork.objects.exists()


def test_circular_trigger_is_rejected(deferred: str) -> None:
    trigger: dict[str, Any] = {"key": "a"}
    trigger["self"] = trigger
    with pytest.raises(InvalidTrigger, match="circular reference"):
        enqueue(deferred, trigger)


@pytest.mark.parametrize(
    ("options", "rule"),
    [
        ({"queue": "high"}, "unknown option\\(s\\) queue. Allowed: delay"),
        ({"delay": -1}, "must not be negative"),
        ({"delay": "soon"}, "number of seconds or a timedelta"),
        ({"delay": float("nan")}, "number of seconds or a timedelta"),
    ],
)
def test_bad_options_are_rejected(deferred: str, options: dict[str, Any], rule: str) -> None:
    with pytest.raises(InvalidEnqueueOption, match=rule):
        enqueue(deferred, {"key": "a"}, **options)
    assert not DeferredWork.objects.exists()


def test_enqueue_errors_share_one_base_class() -> None:
    for error in (InvalidDedupeKey, InvalidTrigger, InvalidEnqueueOption, UnknownWorkflow):
        assert issubclass(error, WorkflowError)
    assert issubclass(InvalidTrigger, EnqueueError)


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_a_transaction_that_rolls_back_leaves_nothing(deferred: str) -> None:
    with transaction.atomic():
        assert enqueue(deferred, {"key": "a"}) is not None
        transaction.set_rollback(True)
    assert not DeferredWork.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_losing_the_dedupe_race_inside_a_transaction_does_not_break_it(deferred: str) -> None:
    existing = enqueue(deferred, {"key": "a"})
    with transaction.atomic():
        assert enqueue(deferred, {"key": "new"}) is not None
        assert enqueue(deferred, {"key": "a"}) == existing  # INSERT fails inside a savepoint
        # The transaction is still usable and commits everything it did.
        assert enqueue(deferred, {"key": "after"}) is not None
    assert set(DeferredWork.objects.values_list("dedupe_key", flat=True)) == {"a", "new", "after"}


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_taken_key_is_no_error_on_the_server_so_its_log_never_shows_the_trigger(
    deferred: str, register_workflow: Any
) -> None:
    """PostgreSQL logs every failed statement with its values (``log_min_error_statement``
    is ``error`` by default, and Django binds them client-side): a duplicate enqueue must
    fail no statement at all. Every statement enqueue sends is recorded: none raises, none
    rolls back to a savepoint, whether pending, done or abandoned, in autocommit mode, in
    the caller's transaction or with a serial key (a savepoint of its own)."""
    serial = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: t["to"]).kind
    sent: list[str] = []
    failed: list[str] = []

    def record(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        try:
            return execute(sql, params, many, context)
        except Exception as error:
            failed.append(type(error).__name__)
            raise

    pending = enqueue(deferred, {"key": "taken", "name": "Canary Patient"})
    done = enqueue(deferred, {"key": "done"})
    abandoned = enqueue(deferred, {"key": "abandoned"})
    DeferredWork.objects.filter(pk=done).update(status=Status.DONE)
    DeferredWork.objects.filter(pk=abandoned).update(status=Status.ABANDONED)
    keyed = enqueue(serial, {"key": "keyed", "to": "+52 55 0000 0000"})
    with connection.execute_wrapper(record):
        assert enqueue(deferred, {"key": "taken", "name": "Canary Patient"}) == pending
        assert enqueue(serial, {"key": "keyed", "to": "+52 55 0000 0000"}) == keyed
        with transaction.atomic():
            assert enqueue(deferred, {"key": "taken"}) == pending
            assert enqueue(deferred, {"key": "done"}) is None
            assert enqueue(serial, {"key": "keyed", "to": "+52 55 0000 0000"}) == keyed
            assert enqueue(deferred, {"key": "abandoned"}) == abandoned  # revived
    assert failed == []
    assert [sql for sql in sent if "ROLLBACK" in sql.upper()] == []
    assert sum(sql.startswith("INSERT") for sql in sent) == 6  # each enqueue did try its INSERT
    assert DeferredWork.objects.get(pk=abandoned).status == Status.PENDING
    assert DeferredWork.objects.count() == 4


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_concurrent_insert_that_commits_first_wins_inside_the_callers_transaction(deferred: str) -> None:
    """The other writer's INSERT is still uncommitted when ours runs, so ours blocks on the
    unique index, then skips the row when it commits; our transaction must go on."""
    inserted = threading.Event()
    release = threading.Event()
    winner: dict[str, Any] = {}

    def other_writer() -> None:
        try:
            with transaction.atomic():
                winner["id"] = enqueue(deferred, {"key": "raced"})
                inserted.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=other_writer)
    thread.start()
    assert inserted.wait(10)
    timer = threading.Timer(0.3, release.set)
    timer.start()
    with transaction.atomic():
        ours = enqueue(deferred, {"key": "raced"})  # blocks until the other commits
        assert enqueue(deferred, {"key": "still-usable"}) is not None
    thread.join(10)
    timer.cancel()
    assert ours == winner["id"]
    assert DeferredWork.objects.filter(dedupe_key="raced").count() == 1
    assert DeferredWork.objects.filter(dedupe_key="still-usable").count() == 1


@pytest.mark.django_db(transaction=True)
def test_eight_threads_enqueuing_one_key_leave_one_row(deferred: str) -> None:
    results = run_together(lambda _: enqueue(deferred, {"key": "same"}), 8)
    assert DeferredWork.objects.count() == 1
    row_id = str(DeferredWork.objects.get().pk)
    assert results == [row_id] * 8


def test_enqueue_many_mirrors_enqueue_one_result_per_trigger(deferred: str) -> None:
    from nexus_workflows import enqueue_many

    pending = enqueue(deferred, {"key": "pending", "v": 1})
    done = enqueue(deferred, {"key": "done"})
    abandoned = enqueue(deferred, {"key": "abandoned"})
    DeferredWork.objects.filter(pk=done).update(status=Status.DONE)
    DeferredWork.objects.filter(pk=abandoned).update(status=Status.ABANDONED, checkpoints={"kept": True})
    triggers = [{"key": f"new-{n}"} for n in range(1200)]
    triggers += [{"key": "pending", "v": 2}, {"key": "done"}, {"key": "abandoned"}, {"key": "new-0"}]
    results = enqueue_many(deferred, triggers)
    assert len(results) == len(triggers)
    new_ids = results[:1200]
    assert all(isinstance(result, str) for result in new_ids)
    assert len(set(new_ids)) == 1200
    assert results[1200:] == [pending, None, abandoned, new_ids[0]]
    assert DeferredWork.objects.count() == 1203
    assert DeferredWork.objects.get(pk=pending).trigger["v"] == 1
    revived = DeferredWork.objects.get(pk=abandoned)
    assert (revived.status, revived.checkpoints) == (Status.PENDING, {"kept": True})
    # Its history says so, as enqueue's revive does.
    assert [(entry["event"], entry["by"]) for entry in revived.history] == [("revived", "enqueue")]
    assert DeferredWork.objects.get(pk=new_ids[5]).trigger == {"key": "new-5"}


def test_enqueue_many_validates_everything_before_writing(deferred: str) -> None:
    from nexus_workflows import enqueue_many

    with pytest.raises(InvalidTrigger):
        enqueue_many(deferred, [{"key": "a"}, {"key": "b", "bad": object()}])
    with pytest.raises(InvalidDedupeKey):
        enqueue_many(deferred, [{"key": "a"}, {"key": ""}])
    with pytest.raises(InvalidEnqueueOption):
        enqueue_many(deferred, [{"key": "a"}], queue="x")
    assert not DeferredWork.objects.exists()
    assert enqueue_many(deferred, []) == []


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True, databases=["default", "prepared"])
def test_enqueue_runs_as_a_prepared_statement_where_the_database_settings_allow_it(
    deferred: str, settings: Any
) -> None:
    """With Django's ``server_side_binding`` and psycopg's ``prepare_threshold`` (the README's
    fast-enqueue configuration), psycopg prepares enqueue's INSERT once it has run that often,
    and everything enqueue answers stays the same: new ids, the pending id for a taken key."""
    from django.db import connections

    settings.DATABASE_ROUTERS = ["tests.testapp.routers.WorkToPrepared"]
    ids = [enqueue(deferred, {"key": f"prepared-{number}"}) for number in range(8)]
    assert None not in ids
    assert len(set(ids)) == 8
    assert enqueue(deferred, {"key": "prepared-0"}) == ids[0]  # the dedupe conflict, prepared
    with connections["prepared"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ['INSERT INTO "nexus_workflows_deferredwork"%'],
        )
        assert cursor.fetchone()[0] == 1
    assert DeferredWork.objects.using("default").filter(kind=deferred).count() == 8


@pytest.mark.parametrize("meanwhile", ["purged", "revived-and-claimed", "revived"])
def test_enqueue_many_reports_abandoned_work_that_changed_before_its_revive_as_it_is_now(
    deferred: str, monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """Between enqueue_many's read (abandoned) and its revive, the purge deletes the row,
    or an operator revives it and a runner claims it. The result must say what is true:
    new work for a purged key, None for work in flight, its id for work still pending."""
    abandoned = int(enqueue(deferred, {"key": "a"}))
    DeferredWork.objects.filter(pk=abandoned).update(status=Status.ABANDONED)
    revive_ids = transitions.revive_ids

    def changed_first(queryset: Any, **options: Any) -> set[int]:
        # What another connection commits between the read and the revive.
        if meanwhile == "purged":
            DeferredWork.objects.filter(pk=abandoned).delete()
        else:
            transitions.revive(DeferredWork.objects.filter(pk=abandoned))
            if meanwhile == "revived-and-claimed":
                assert Claimer(kinds=[deferred], using="default").claim_due(1)
        return revive_ids(queryset, **options)

    monkeypatch.setattr(transitions, "revive_ids", changed_first)
    from nexus_workflows import enqueue_many

    (result,) = enqueue_many(deferred, [{"key": "a"}])
    (row,) = DeferredWork.objects.filter(kind=deferred, dedupe_key="a")
    if meanwhile == "purged":
        assert (result, row.status) == (str(row.pk), Status.PENDING)
        assert row.pk != abandoned
    elif meanwhile == "revived-and-claimed":
        assert (result, row.status) == (None, Status.PROCESSING)
    else:
        assert (result, row.status) == (str(abandoned), Status.PENDING)

"""Every statement of ``nexus_workflows.sql`` run against the real database, as it is
called (``bin/test`` runs this file on Django 5.2 and on Django 6.1)."""

from __future__ import annotations

import json
import select
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import override_settings
from django.utils import timezone

from nexus_workflows import sql
from nexus_workflows.clock import DatabaseNow, database_now
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.inserts import insert_pending, insert_pending_many_postgresql, one_row_statement
from nexus_workflows.deferred.wakeup import CHANNEL
from nexus_workflows.models import DEDUPE_CONSTRAINT, DeferredWork, Status
from nexus_workflows.phi.models import PhiToken, TokenMap
from nexus_workflows.sql import portable, returning
from tests.processes import wait_for
from tests.raw_connections import raw_connection, row_locked

pytestmark = pytest.mark.django_db(transaction=True)


def new_row(key: str, **fields: Any) -> int:
    trigger = {"key": key}
    return insert_pending("default", kind="k", dedupe_key=key, trigger=trigger, now=timezone.now(), **fields)


def test_each_backend_has_its_module() -> None:
    assert sql.for_connection("default").__name__ == f"nexus_workflows.sql.{connection.vendor}"


def test_the_precompiled_insert_returns_the_new_id_and_writes_the_defaults() -> None:
    work_id = new_row("a", priority=5, queue_name="q", backend_name="b")
    row = DeferredWork.objects.get(pk=work_id)
    assert (row.kind, row.dedupe_key, row.trigger, row.status) == ("k", "a", {"key": "a"}, Status.PENDING)
    assert (row.priority, row.queue_name, row.backend_name, row.history, row.worker_ids) == (
        5,
        "q",
        "b",
        [],
        [],
    )


@pytest.mark.postgresql
@pytest.mark.parametrize("prepare", [None, True], ids=["bound-by-the-client", "prepared"])
def test_the_insert_statement_alone_writes_on_bare_psycopg_what_insert_pending_writes(
    prepare: bool | None,
) -> None:
    """The benchmarks time the app's INSERT on bare psycopg: it must be the same write."""
    import psycopg

    now, before = timezone.now(), database_now("default")
    trigger = {"key": "alone"}
    sql_text, params = one_row_statement("default", kind="k", dedupe_key="alone", trigger=trigger, now=now)
    factory = psycopg.ClientCursor if prepare is None else psycopg.Cursor
    # Django's parameters turn preparing off (prepare_threshold None); psycopg's default is 5.
    with raw_connection(cursor_factory=factory, prepare_threshold=5) as bare:
        work_id, created_at = bare.execute(sql_text, params, prepare=prepare).fetchone()
        # The key taken: no row, and no error (ON CONFLICT ON CONSTRAINT nw_unique_dedupe_key).
        assert bare.execute(sql_text, params, prepare=prepare).fetchone() is None
        if prepare:
            assert bare.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 1
    alone = DeferredWork.objects.filter(pk=work_id).values().get()
    usual = DeferredWork.objects.filter(pk=new_row("usual")).values().get()
    differs = {"id", "kind", "dedupe_key", "trigger", "next_attempt_at", "created_at", "updated_at"}
    assert {k: v for k, v in alone.items() if k not in differs} == {
        k: v for k, v in usual.items() if k not in differs
    }
    assert (alone["kind"], alone["trigger"], alone["status"]) == ("k", {"key": "alone"}, Status.PENDING)
    # The database's clock, also for the stamps, returned with the id.
    assert before <= alone["created_at"] == alone["updated_at"] == created_at <= database_now("default")
    assert before <= alone["next_attempt_at"] <= database_now("default")


@pytest.mark.postgresql
def test_the_insert_with_constants_binds_only_the_varying_values() -> None:
    fields = DeferredWork._meta.get_field
    varying = [fields(name) for name in ("kind", "dedupe_key", "trigger", "next_attempt_at")]
    constants = [
        (field, field.get_db_prep_save(field.get_default(), connection=connection))
        for field in DeferredWork._meta.concrete_fields
        if not field.primary_key and field not in varying
    ]
    stamped = {"created_at", "updated_at"}
    constants = [(f, timezone.now() if f.name in stamped else v) for f, v in constants]
    constants = [(f, "50% off 'quoted'" if f.name == "last_error" else v) for f, v in constants]
    statement, trailing = sql.postgresql.insert_returning_pk_with_constants(
        DeferredWork, varying, constants, "default"
    )
    assert statement.count("%s") == len(varying)
    assert trailing == ()
    with connection.cursor() as cursor:
        trigger = fields("trigger").get_db_prep_save({"key": "a"}, connection=connection)
        cursor.execute(statement, ["k", "a", trigger, timezone.now()])
        work_id = cursor.fetchone()[0]
    row = DeferredWork.objects.get(pk=work_id)
    assert (row.trigger, row.status, row.last_error, row.history) == (
        {"key": "a"},
        Status.PENDING,
        "50% off 'quoted'",
        [],
    )


@pytest.mark.needs("update_returning")
def test_update_returning_returns_the_rows_it_wrote_converted() -> None:
    first, second = new_row("a"), new_row("b")
    rows = returning.update_returning(
        DeferredWork.objects.filter(pk=first),
        {"checkpoints": {"step": 1}, "heartbeat_at": DatabaseNow()},
        ("pk", "checkpoints", "heartbeat_at", "trigger"),
    )
    assert [(row["pk"], row["checkpoints"], row["trigger"]) for row in rows] == [
        (first, {"step": 1}, {"key": "a"})
    ]
    assert isinstance(rows[0]["heartbeat_at"], datetime)
    assert timezone.is_aware(rows[0]["heartbeat_at"])
    assert DeferredWork.objects.get(pk=second).checkpoints == {}
    assert returning.update_returning(DeferredWork.objects.filter(pk=-1), {"attempt": 1}, ("pk",)) == []


@pytest.mark.needs("update_returning")
def test_a_precompiled_update_binds_its_slots_anew_on_each_run() -> None:
    first, second = new_row("a"), new_row("b")
    slot_id, slot_checkpoints = -(2**62), "slot"
    statement = returning.PrecompiledUpdate(
        DeferredWork.objects.filter(pk__in=[slot_id], status=Status.PENDING),
        {"claim_token": slot_checkpoints, "heartbeat_at": DatabaseNow()},
        ("pk", "claim_token", "trigger", "heartbeat_at"),
        [slot_checkpoints, slot_id],
    )
    rows = statement.run(["t1", first])
    assert [(row["pk"], row["claim_token"], row["trigger"]) for row in rows] == [(first, "t1", {"key": "a"})]
    assert timezone.is_aware(rows[0]["heartbeat_at"])
    assert [row["pk"] for row in statement.run(["t2", second])] == [second]
    assert statement.run(["t3", -5]) == []
    tokens = dict(DeferredWork.objects.values_list("pk", "claim_token"))
    assert tokens == {first: "t1", second: "t2"}
    with pytest.raises(ValueError, match="appears 0 times"):
        returning.PrecompiledUpdate(DeferredWork.objects.all(), {"attempt": 1}, ("pk",), ["absent"])


@pytest.mark.parametrize("backend", ["backend's", "portable"])
def test_a_dedupe_clash_is_named_by_its_constraint(backend: str) -> None:
    new_row("a")
    with pytest.raises(IntegrityError) as clash, transaction.atomic():
        # Through the ORM: on PostgreSQL insert_pending skips a taken key without an error.
        DeferredWork.objects.create(kind="k", dedupe_key="a", trigger={"key": "a"})
    statements = sql.for_connection("default") if backend == "backend's" else portable
    if backend == "portable" and connection.vendor == "sqlite":
        assert statements.violated_constraint(clash.value) is None  # SQLite names columns only
    else:
        assert statements.violated_constraint(clash.value) == DEDUPE_CONSTRAINT


def test_another_refusal_is_not_a_dedupe_clash() -> None:
    with pytest.raises(IntegrityError) as refusal, transaction.atomic():
        DeferredWork.objects.create(kind="k", dedupe_key="a", trigger=None)  # NOT NULL
    assert sql.for_connection("default").violated_constraint(refusal.value) != DEDUPE_CONSTRAINT


def test_a_refusal_is_named_by_its_constraint_where_the_backend_reads_it() -> None:
    new_row("a")
    with pytest.raises(IntegrityError) as clash, transaction.atomic():
        DeferredWork.objects.create(kind="k", dedupe_key="a", trigger={"key": "a"})
    named = connection.vendor in ("postgresql", "mysql")
    expected = f"constraint {DEDUPE_CONSTRAINT!r}" if named else "IntegrityError"
    assert sql.refused_by(clash.value, "default") == expected
    assert "'a'" not in sql.refused_by(clash.value, "default")  # never the row's values


def test_every_backend_module_answers_the_same_questions() -> None:
    """Callers ask ``for_connection(using)`` and never test the vendor: each module has
    every function the others have that callers use on any backend."""
    from nexus_workflows.sql import mysql, postgresql, sqlite

    shared = {
        "claimable",
        "constraint_name",
        "due_ids",
        "lock_waits_at_most",
        "notify",
        "statement_timeout",
        "violated_constraint",
    }
    for module in (postgresql, sqlite, mysql, portable):
        assert shared <= set(module.__all__), module.__name__
        assert all(callable(getattr(module, name)) for name in shared)


@pytest.mark.postgresql
def test_due_ids_merges_kinds_and_queues_in_the_claims_order() -> None:
    due_ids_merge_kinds_and_queues_in_the_claims_order()


@pytest.mark.mysql
def test_due_ids_on_mariadb_merge_kinds_and_queues_in_the_claims_order() -> None:
    due_ids_merge_kinds_and_queues_in_the_claims_order()


def due_ids_merge_kinds_and_queues_in_the_claims_order() -> None:
    """Per kind and per queue, merged: priority first, then due time; rows of other kinds
    and queues, not yet due, or not pending are left out; a task row whose kind is also
    asked for comes once; ``now`` given or the database's."""
    start = timezone.now() - timedelta(minutes=5)

    def row(key: str, due: datetime, kind: str = "k", queue: str = "", priority: int = 0) -> int:
        fields = {"queue_name": queue, "backend_name": "default" if queue else "", "priority": priority}
        created = DeferredWork.objects.create(
            kind=kind, dedupe_key=key, trigger={}, next_attempt_at=due, **fields
        )
        return created.pk

    rows = {
        "a1": row("a1", start),
        "t-high": row("t-high", start, "x.task", "q1", 5),
        "a2": row("a2", start - timedelta(seconds=1)),
        "t-low": row("t-low", start, "x.task", "q2", -5),
        "other": row("other", start - timedelta(hours=1), "gone"),
        "q3": row("q3", start + timedelta(seconds=1), "x.task", "q3", 9),
        "later": row("later", timezone.now() + timedelta(hours=1)),
        "done": row("done", start),
    }
    DeferredWork.objects.filter(pk=rows["done"]).update(status=Status.DONE)
    due_ids = sql.for_connection("default").due_ids
    by_id = {pk: key for key, pk in rows.items()}

    def keys(
        kinds: list[str], queues: list[str] | None, now: datetime | None = None, limit: int = 10
    ) -> list[str]:
        return [by_id[pk] for pk, _ in due_ids("default", kinds, queues, now, limit)]

    assert keys(["k"], ["q1", "q2"]) == ["t-high", "a2", "a1", "t-low"]
    assert keys(["k", "x.task"], None) == ["q3", "t-high", "a2", "a1", "t-low"]
    assert keys([], ["q2"]) == ["t-low"]
    assert keys(["k"], [], limit=2) == ["a2", "a1"]
    assert keys(["k"], [], now=timezone.now() + timedelta(hours=2)) == ["a2", "a1", "later"]
    assert keys([], []) == []
    assert due_ids("default", [], ["q1"], None, 1) == [(rows["t-high"], "q1")]


@pytest.mark.mysql
def test_due_ids_on_mariadb_without_its_indexes_leave_the_read_to_the_orm() -> None:
    """Code that runs before migration 0018 has built MariaDB's due indexes: ``due_ids``
    answers None (the ORM's read of nw_due_idx, as before) instead of failing every claim on
    the missing index; with the indexes built again it reads them."""
    from nexus_workflows.sql import mysql

    work = DeferredWork.objects.create(kind="k", dedupe_key="a", trigger={}, next_attempt_at=timezone.now())
    with connection.schema_editor() as editor:
        mysql.drop_due_indexes(editor, DeferredWork._meta.db_table)
    try:
        assert mysql.due_ids("default", ["k"], None, None, 5) is None
    finally:
        with connection.schema_editor() as editor:
            mysql.add_due_indexes(editor, DeferredWork._meta.db_table)
    assert mysql.due_ids("default", ["k"], [], None, 5) == [(work.pk, "")]


def _tasks_in_queues(queues: list[str], rows: int = 30) -> None:
    """``rows`` due tasks in each of ``queues`` (three priorities), and the table's statistics."""
    past = timezone.now() - timedelta(minutes=5)
    DeferredWork.objects.bulk_create(
        DeferredWork(
            kind="x.task",
            dedupe_key=f"{queue}-{n}",
            trigger={},
            queue_name=queue,
            priority=n % 3,
            next_attempt_at=past - timedelta(seconds=n),
        )
        for queue in queues
        for n in range(rows)
    )
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE TABLE {DeferredWork._meta.db_table}")
        cursor.fetchall()  # its report


def _every_queue_read(limit: int) -> tuple[list[tuple[int, str]] | None, list[str]]:
    """``due_ids`` of every queue and no kind, and the statements it sent."""
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        found = sql.for_connection("default").due_ids("default", [], None, None, limit)
    return found, [query["sql"] for query in queries.captured_queries]


@pytest.mark.mysql
def test_a_runner_of_every_queue_on_mariadb_finds_its_queues_in_one_statement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``due_ids`` of every queue (``queues=None``) with 20 queues pending: once the queues
    are known (a runner's first search), two statements (the queues, then the merged read),
    not a probe and a round trip per queue (22); the search reads no pending task's row.
    Queues that differ by case or a trailing space are apart (``utf8mb4_nopad_bin``); a queue
    of finished tasks only, and workflows (no queue), are not taken."""
    from nexus_workflows.sql import mysql
    from tests.examined import rows_examined

    monkeypatch.setattr(mysql, "_KNOWN_QUEUES", {}, raising=False)  # a fresh runner
    queues = [f"queue-{n:02d}" for n in range(17)] + ["Mixed", "mixed", "mixed "]
    past = timezone.now() - timedelta(minutes=5)
    DeferredWork.objects.bulk_create(
        DeferredWork(kind="k", dedupe_key=f"w{n}", trigger={}, next_attempt_at=past) for n in range(30)
    )
    DeferredWork.objects.bulk_create(
        DeferredWork(kind="x.task", dedupe_key=f"d{n}", trigger={}, queue_name="finished", status=Status.DONE)
        for n in range(30)
    )
    _tasks_in_queues(queues)
    _every_queue_read(1)  # the runner's first search
    found, statements = _every_queue_read(100)
    assert len(statements) == 2, statements
    expected = list(
        DeferredWork.objects.filter(queue_name__in=queues)
        .order_by("-priority", "next_attempt_at", "pk")
        .values_list("pk", "queue_name")[:100]
    )
    assert found == expected
    assert {queue for _, queue in _every_queue_read(1_000)[0] or []} == set(queues)
    examined = rows_examined(statements[0])
    assert examined < 100, f"finding the queues examined {examined} rows"


@pytest.mark.mysql
def test_a_runner_of_every_queue_on_mariadb_finds_new_queues_and_leaves_emptied_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The search probes after the queues it found last time: queues new since (before,
    between and after those) are found, one statement more per queue found between the
    same two names; a queue emptied since is not read."""
    from nexus_workflows.sql import mysql

    monkeypatch.setattr(mysql, "_KNOWN_QUEUES", {}, raising=False)  # a fresh runner
    _tasks_in_queues(["b", "d"], rows=2)
    assert {queue for _, queue in _every_queue_read(10)[0] or []} == {"b", "d"}
    _tasks_in_queues(["a", "c", "e"], rows=2)
    DeferredWork.objects.filter(queue_name="d").update(status=Status.DONE)
    found, statements = _every_queue_read(10)
    assert {queue for _, queue in found or []} == {"a", "b", "c", "e"}
    assert len(statements) == 3, statements  # a, c, e each the next after a known name
    _tasks_in_queues(["ca", "cb", "cc"], rows=2)
    found, statements = _every_queue_read(10)
    assert {queue for _, queue in found or []} == {"a", "b", "c", "ca", "cb", "cc", "e"}
    assert len(statements) == 5, statements  # three queues after c: one more round each


def claimable_ids(ids: list[int]) -> list[int]:
    """The rows of ``ids`` a claim may take (in a transaction, as the claim's)."""
    with transaction.atomic():
        pending = DeferredWork.objects.filter(status=Status.PENDING)
        rows = sql.for_connection("default").claimable(pending, ids)
        return sorted(rows.values_list("pk", flat=True))


@pytest.mark.needs("row_locks")
def test_claimable_rows_leave_out_a_row_another_session_holds_a_lock_on() -> None:
    ids = [new_row("a"), new_row("b"), new_row("c")]
    with row_locked(DeferredWork, ids[1]):
        assert claimable_ids(ids) == [ids[0], ids[2]]  # without waiting for the lock
    assert claimable_ids(ids) == ids
    DeferredWork.objects.filter(pk=ids[0]).update(status=Status.DONE)
    assert claimable_ids(ids) == ids[1:]  # the claim's conditions hold as ever
    assert claimable_ids([]) == []


@pytest.mark.postgresql
def test_the_jsonb_bulk_insert_skips_taken_keys() -> None:
    taken = new_row("a")
    now = timezone.now()
    triggers = {key: json.dumps({"key": key}) for key in ("a", "b", "c")}
    before = database_now("default")
    inserted = insert_pending_many_postgresql(
        "default", kind="k", keys=list(triggers), triggers=triggers, delay=timedelta(minutes=5), now=now
    )
    assert set(inserted) == {"b", "c"}
    due = DeferredWork.objects.get(pk=inserted["b"]).next_attempt_at - timedelta(minutes=5)
    assert before <= due <= database_now("default")  # the database's clock, plus the delay
    rows = {row.dedupe_key: row for row in DeferredWork.objects.all()}
    assert rows["a"].pk == taken
    assert (rows["c"].pk, rows["c"].trigger, rows["c"].status) == (
        inserted["c"],
        {"key": "c"},
        Status.PENDING,
    )


@pytest.mark.postgresql
def test_the_phi_allocation_inserts_only_while_the_sequence_is_unchanged() -> None:
    token_map = TokenMap.objects.create(code_hash="h" * 64, sequence=3)
    statement = sql.postgresql.allocate_token_sql(
        connection,
        TokenMap._meta,
        PhiToken._meta,
        ["category", "number", "token", "lookup_key", "encrypted_surface"],
    )
    now = timezone.now()

    def allocate(expected: int, number: int) -> Any:
        values = ["PERSONA", number, f"[PERSONA_{number}]", f"lookup-{number}", "cipher"]
        with connection.cursor() as cursor:
            cursor.execute(statement, [number, now, token_map.pk, expected, *values, now, now])
            return cursor.fetchone()

    (token_id,) = allocate(3, 4)
    assert PhiToken.objects.get(pk=token_id).number == 4
    assert TokenMap.objects.get(pk=token_map.pk).sequence == 4
    assert allocate(3, 4) is None  # the sequence moved: nothing inserted
    assert PhiToken.objects.count() == 1


@pytest.mark.postgresql
def test_notify_reaches_a_listen() -> None:
    with raw_connection() as listener:
        sql.postgresql.listen(listener, CHANNEL)
        with connection.cursor() as cursor:
            sql.postgresql.notify(cursor, CHANNEL, "probe-1")
        select.select([listener.fileno()], [], [], 5)
        payloads = [notice.payload for notice in listener.notifies(timeout=5, stop_after=1)]
    assert payloads == ["probe-1"]


def test_outcome_counts_are_added_once_per_token() -> None:
    from nexus_workflows.observability import counts
    from nexus_workflows.observability.models import OutcomeCount

    assert counts.add({("k", "done"): 2, ("k", "failed"): 1}, token="t1", using="default")
    assert not counts.add({("k", "done"): 2}, token="t1", using="default")  # a retry of t1
    assert counts.add({("k", "done"): 3}, token="t2", using="default")
    totals = dict(OutcomeCount.objects.values_list("outcome", "count"))
    assert totals == {"done": 5, "failed": 1}


def test_a_minute_as_epoch_seconds() -> None:
    from nexus_workflows.observability.models import OutcomeCount

    minute = timezone.now().replace(second=0, microsecond=0)
    OutcomeCount.objects.create(minute=minute, kind="k", outcome="done", count=1)
    epoch = sql.for_connection("default").EPOCH_OF_MINUTE.replace("%%", "%")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {epoch} FROM {OutcomeCount._meta.db_table}")
        assert cursor.fetchone()[0] == int(minute.timestamp())


def test_the_journal_writers_batch_writes_only_rows_whose_claim_holds() -> None:
    """``transitions.save_journals``: PostgreSQL's one-statement batch, the ORM elsewhere."""
    from nexus_workflows.deferred import transitions
    from nexus_workflows.deferred.claims import Claimer

    for key in ("a", "b"):
        new_row(key)
    held, lost = sorted(Claimer(kinds=["k"], using="default").claim_due(2), key=lambda work: work.dedupe_key)
    DeferredWork.objects.filter(pk=lost.id).update(claim_token="someone else's")
    result = transitions.save_journals([(held, {"step": 1}), (lost, {"step": 9})], using="default")
    assert result == transitions.JournalsWritten(written={held.id}, held=set())
    rows = {row.pk: row for row in DeferredWork.objects.all()}
    assert rows[held.id].checkpoints == {"step": 1}
    assert rows[held.id].started_at is not None
    assert rows[lost.id].checkpoints == {}
    assert rows[lost.id].started_at is None


@pytest.mark.needs("row_locks")
def test_the_journal_writers_batch_skips_a_row_another_session_holds() -> None:
    """The batch does not wait for a locked row: it writes the others and names the held
    one (its claim still holds) apart from a lost one."""
    from nexus_workflows.deferred import transitions
    from nexus_workflows.deferred.claims import Claimer
    from tests.raw_connections import row_locked

    for key in ("a", "b", "c"):
        new_row(key)
    claimed = Claimer(kinds=["k"], using="default").claim_due(3)
    free, locked, lost = sorted(claimed, key=lambda work: work.dedupe_key)
    DeferredWork.objects.filter(pk=lost.id).update(claim_token="someone else's")
    with row_locked(DeferredWork, locked.id):
        result = transitions.save_journals(
            [(free, {"step": 1}), (locked, {"step": 2}), (lost, {"step": 3})], using="default"
        )
    assert result == transitions.JournalsWritten(written={free.id}, held={locked.id})
    rows = dict(DeferredWork.objects.values_list("pk", "checkpoints"))
    assert rows == {free.id: {"step": 1}, locked.id: {}, lost.id: {}}


@pytest.mark.needs("row_locks")
def test_a_save_written_alone_waits_for_its_rows_lock_at_most_as_long_as_told() -> None:
    """The journal writer's write of a held row: in the lock's queue, but bounded (then the
    database's own lock error); written once the row is free; False when the claim is lost."""
    from django.db import OperationalError

    from nexus_workflows.database_errors import is_lock_wait_cut_short
    from nexus_workflows.deferred import transitions
    from nexus_workflows.deferred.claims import Claimer
    from tests.raw_connections import row_locked

    new_row("a")
    (work,) = Claimer(kinds=["k"], using="default").claim_due(1)
    with row_locked(DeferredWork, work.id), pytest.raises(OperationalError) as waited:
        transitions.save_journal_waiting(work, {"step": 1}, at_most=0.1)
    assert is_lock_wait_cut_short(waited.value)
    assert DeferredWork.objects.get(pk=work.id).checkpoints == {}
    assert transitions.save_journal_waiting(work, {"step": 2}, at_most=0.1) is True
    assert DeferredWork.objects.get(pk=work.id).checkpoints == {"step": 2}
    DeferredWork.objects.filter(pk=work.id).update(claim_token="someone else's")
    assert transitions.save_journal_waiting(work, {"step": 3}, at_most=0.1) is False
    assert DeferredWork.objects.get(pk=work.id).checkpoints == {"step": 2}


def test_the_sessions_lock_wait_limit() -> None:
    """The least of the limits that end a statement's wait for a lock, that are set."""
    from nexus_workflows.deferred import transitions

    limit = lambda: transitions.lock_wait_limit("default")  # noqa: E731
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            assert limit() is None  # the default: for ever
            cursor.execute("SET lock_timeout = '1500ms'")
            assert limit() == 1.5
            cursor.execute("SET statement_timeout = '1s'")
            assert limit() == 1.0
            cursor.execute("SET lock_timeout = 0")
            assert limit() == 1.0
            cursor.execute("RESET lock_timeout")
            cursor.execute("RESET statement_timeout")
        elif connection.vendor == "mysql":
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 7")
            assert limit() == 7.0
            cursor.execute("SET SESSION max_statement_time = 2.5")
            assert limit() == 2.5
            cursor.execute("SET SESSION max_statement_time = 0")
            assert limit() == 7.0
            cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
        else:
            assert limit() is None  # no row locks


@pytest.mark.postgresql
def test_a_local_lock_timeout_holds_for_its_transaction_only() -> None:
    from nexus_workflows.sql import postgresql

    with transaction.atomic(), connection.cursor() as cursor:
        postgresql.set_local_lock_timeout(cursor, 0.25)
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "250ms"
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] != "250ms"


@pytest.mark.postgresql
@pytest.mark.parametrize(
    ("setting", "seconds"), [("0", 0.0), ("380", 0.38), ("'5s'", 5.0), ("'2min'", 120.0), ("'1h'", 3600.0)]
)
def test_the_sessions_statement_timeout_in_seconds(setting: str, seconds: float) -> None:
    from nexus_workflows.sql import postgresql

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL statement_timeout = {setting}")
        assert postgresql.statement_timeout("default") == seconds


def test_the_statement_timeout_is_unknown_elsewhere() -> None:
    if connection.vendor != "postgresql":
        assert sql.for_connection("default").statement_timeout("default") is None
    assert portable.statement_timeout("default") is None


def test_a_block_of_bounded_lock_waits_runs_and_commits_on_every_backend() -> None:
    """Every backend's module has it; on PostgreSQL and MariaDB it says the bound in
    effect, on SQLite (no row locks) None."""
    kept, gone = new_row("kept"), new_row("gone")
    with sql.for_connection("default").lock_waits_at_most("default", 0.5) as seconds:
        DeferredWork.objects.filter(pk=gone).delete()
    # MariaDB's innodb_lock_wait_timeout is whole seconds (its server default: 50).
    assert seconds == {"postgresql": 0.5, "mysql": 1.0}.get(connection.vendor)
    assert list(DeferredWork.objects.values_list("pk", flat=True)) == [kept]


def test_a_block_of_values_sent_apart_runs_and_commits_on_every_backend() -> None:
    with sql.for_connection("default").values_sent_apart("default"):
        kept = new_row("kept")
        DeferredWork.objects.filter(pk=kept).update(checkpoints={"note": "kept"})
    assert DeferredWork.objects.get(pk=kept).checkpoints == {"note": "kept"}


@pytest.mark.postgresql
def test_values_sent_apart_binds_on_the_server_for_the_block_only() -> None:
    """The server sees ``$1`` where the block's values were, and the values inline (as
    Django binds them) before and after it; a block within one leaves the outer's as it
    was."""

    apart = sql.for_connection("default").values_sent_apart
    assert "'nw' = 'nw'" in seen_by_server()
    with apart("default"):
        assert "$1 = $2" in seen_by_server()
        with apart("default"):
            assert "$1 = $2" in seen_by_server()
        assert "$1 = $2" in seen_by_server()
    assert "'nw' = 'nw'" in seen_by_server()
    connection.close()
    with apart("default"):  # a closed connection is opened first
        assert "$1 = $2" in seen_by_server()


def seen_by_server() -> str:
    """The text of this statement as the server received it: ``$1 = $2`` when bound on
    the server, ``'nw' = 'nw'`` when Django bound it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT query FROM pg_stat_activity WHERE pid = pg_backend_pid() AND %s = %s", ["nw", "nw"]
        )
        return str(cursor.fetchone()[0])


@pytest.mark.postgresql
def test_values_sent_apart_swaps_on_the_session_that_replaces_one_the_health_check_finds_dead() -> None:
    """``CONN_HEALTH_CHECKS``: the first cursor after a request starts replaces a dead
    session. The block does so before it swaps, or its statements would go out on the new
    session bound by Django, values inline."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with raw_connection() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        ended = "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = %s)"
        wait_for(lambda: other.execute(ended, [pid]).fetchone()[0], timeout=10, what="the session ended")
    enabled = connection.health_check_enabled
    # As a request's start leaves it with CONN_HEALTH_CHECKS on (close_old_connections).
    connection.health_check_enabled, connection.health_check_done = True, False
    try:
        with sql.for_connection("default").values_sent_apart("default"):
            assert "$1 = $2" in seen_by_server()
    finally:
        connection.health_check_enabled = enabled


@pytest.mark.postgresql
def test_values_sent_apart_prepares_nothing_whatever_prepare_threshold_says() -> None:
    """A ``prepare_threshold`` set without server-side binding did nothing (a client-side
    cursor never prepares): the block must not start preparing, which PgBouncer in
    transaction mode cannot serve. The threshold is the connection's again after it."""
    connection.ensure_connection()
    raw = connection.connection
    threshold = raw.prepare_threshold
    raw.prepare_threshold = 1  # as OPTIONS={"prepare_threshold": 1} would
    try:
        with sql.for_connection("default").values_sent_apart("default"):
            for _ in range(3):
                assert "$1 = $2" in seen_by_server()
        assert raw.prepare_threshold == 1
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_prepared_statements")
            assert cursor.fetchone()[0] == 0
    finally:
        raw.prepare_threshold = threshold


@pytest.mark.postgresql
def test_a_revive_binds_on_the_database_its_update_goes_to() -> None:
    """A router that reads from another database: the revive's ``UPDATE`` goes to the
    write database, and is bound on the server there."""

    class ReadsElsewhere:
        def db_for_read(self, model: Any, **hints: Any) -> str:
            return "direct"

        def db_for_write(self, model: Any, **hints: Any) -> str:
            return "default"

    work = new_row("revived")
    DeferredWork.objects.filter(pk=work).update(status=Status.ABANDONED)
    cursors: list[str] = []

    def record(execute: Any, statement: str, params: Any, many: bool, context: Any) -> Any:
        if statement.startswith("UPDATE"):
            cursors.append(type(context["cursor"].cursor).__name__)
        return execute(statement, params, many, context)

    with override_settings(DATABASE_ROUTERS=[ReadsElsewhere()]), connection.execute_wrapper(record):
        assert DeferredWork.objects.filter(pk=work).db == "direct"
        assert transitions.revive(DeferredWork.objects.filter(pk=work)) == 1
    assert cursors == ["ServerBindingCursor"]


@pytest.mark.postgresql
@pytest.mark.parametrize(
    ("session", "in_effect"),
    [
        ([], "500ms"),  # no lock_timeout: the bound
        (["SET lock_timeout = 100"], "100ms"),  # a lower one of the session's stays
        (["SET lock_timeout = '5s'"], "500ms"),  # a higher one does not
        (["SET statement_timeout = 300"], "150ms"),  # half the statement_timeout: a conflict first
        (["SET lock_timeout = 100", "SET statement_timeout = 300"], "100ms"),
    ],
)
def test_bounded_lock_waits_take_the_least_and_last_for_the_block_only(
    session: list[str], in_effect: str
) -> None:
    from nexus_workflows.sql import postgresql

    try:
        with connection.cursor() as cursor:
            for statement in session:
                cursor.execute(statement)
            cursor.execute("SHOW lock_timeout")
            before = cursor.fetchone()[0]
            with postgresql.lock_waits_at_most("default", 0.5) as seconds:
                assert connection.in_atomic_block  # SET LOCAL needs a transaction
                cursor.execute("SHOW lock_timeout")
                assert cursor.fetchone()[0] == in_effect
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == before
        assert seconds == int(in_effect.removesuffix("ms")) / 1000
    finally:
        connection.close()  # the session's settings go with it


@pytest.mark.needs("row_locks")
def test_a_bounded_lock_wait_is_a_transaction_conflict_and_undoes_the_statement() -> None:
    """A row another session locked: the DELETE gives up after the bound (PostgreSQL 0.1 s;
    MariaDB 1 s, its least) with the error the purge takes for meeting another transaction,
    and deletes nothing; the session's own setting is as it was."""
    from django.db import OperationalError

    from nexus_workflows.database_errors import transaction_conflict
    from tests.raw_connections import row_locked

    kept, locked = new_row("kept"), new_row("locked")
    setting = {"postgresql": "lock_timeout", "mysql": "innodb_lock_wait_timeout"}[connection.vendor]

    def delete_both() -> None:
        with sql.for_connection("default").lock_waits_at_most("default", 0.1):
            DeferredWork.objects.filter(pk__in=[kept, locked])._raw_delete("default")

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT @@SESSION.{setting}" if connection.vendor == "mysql" else f"SHOW {setting}")
        before = cursor.fetchone()[0]
        with row_locked(DeferredWork, locked):
            started = time.monotonic()
            with pytest.raises(OperationalError) as raised:
                delete_both()
            waited = time.monotonic() - started
        cursor.execute(f"SELECT @@SESSION.{setting}" if connection.vendor == "mysql" else f"SHOW {setting}")
        assert cursor.fetchone()[0] == before
    assert transaction_conflict(raised.value) == f"it waited longer than {setting} for a lock"
    assert waited < (1.9 if connection.vendor == "mysql" else 0.9)
    assert DeferredWork.objects.count() == 2
    assert connection.get_autocommit()


@pytest.mark.mysql
@pytest.mark.parametrize(
    ("session", "bound", "in_effect"),
    [
        (50, 0.5, 1),  # the server's default: the bound, in whole seconds, at least 1
        (50, 2.5, 3),
        (1, 2.5, 1),  # a lower one of the session's stays
        (0, 0.5, 0),  # 0 is no wait at all here, the lowest
    ],
)
def test_bounded_lock_waits_on_mariadb_take_the_least_and_put_the_session_back(
    session: int, bound: float, in_effect: int
) -> None:
    from nexus_workflows.sql import mysql

    try:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [session])
            with mysql.lock_waits_at_most("default", bound) as seconds:
                cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
                assert cursor.fetchone()[0] == in_effect
            cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
            assert cursor.fetchone()[0] == session
        assert seconds == in_effect
    finally:
        connection.close()  # the session's settings go with it


@pytest.mark.postgresql
def test_bounded_lock_waits_leave_a_callers_transaction_as_it_is() -> None:
    """In a transaction already, a local lock_timeout would outlast the block: none is set."""
    from nexus_workflows.sql import postgresql

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        before = cursor.fetchone()[0]
        with postgresql.lock_waits_at_most("default", 0.25) as seconds:
            cursor.execute("SHOW lock_timeout")
            assert cursor.fetchone()[0] == before
    assert seconds is None


@pytest.mark.needs("server")
def test_the_row_estimate_is_the_databases_and_counts_nothing() -> None:
    """``estimated_rows`` (the admin's "about"): PostgreSQL's planner estimate, filtered
    or not; MariaDB's for a whole table only (a condition's was far off). After the
    table's statistics are read, the estimate of a status is close to its count."""
    from nexus_workflows.admin.counting import estimated_rows

    ids = [new_row(f"e-{n}") for n in range(300)]
    DeferredWork.objects.filter(pk__in=ids[:200]).update(status=Status.DONE)
    with connection.cursor() as cursor:
        cursor.execute(
            f"ANALYZE {'TABLE ' if connection.vendor == 'mysql' else ''}{DeferredWork._meta.db_table}"
        )
        if cursor.description:
            cursor.fetchall()
    assert 250 <= (estimated_rows(DeferredWork.objects.all(), filtered=False) or 0) <= 350
    done = DeferredWork.objects.filter(status=Status.DONE)
    if connection.vendor == "postgresql":
        assert 150 <= (estimated_rows(done, filtered=True) or 0) <= 250
    else:
        assert estimated_rows(done, filtered=True) is None


@pytest.mark.postgresql
def test_the_stored_kinds_are_read_one_index_probe_each() -> None:
    for kind in ("b-kind", "a-kind", "b-kind", "c-kind"):
        DeferredWork.objects.create(
            kind=kind, dedupe_key=f"{kind}-{DeferredWork.objects.count()}", trigger={}
        )
    assert sql.postgresql.distinct_kinds("default") == ["a-kind", "b-kind", "c-kind"]
    DeferredWork.objects.all().delete()
    assert sql.postgresql.distinct_kinds("default") == []


@pytest.mark.postgresql
def test_an_index_is_valid_invalid_or_missing() -> None:
    table = DeferredWork._meta.db_table
    session = raw_connection()
    try:
        session.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE false")  # the table exists
        with connection.cursor() as cursor:
            assert sql.postgresql.index_validity(cursor, table, "nw_due_idx") is True
            assert sql.postgresql.index_validity(cursor, table, "no_such_idx") is None
        for key in ("x", "x"):
            DeferredWork.objects.create(kind=f"k-{DeferredWork.objects.count()}", dedupe_key=key, trigger={})
        # A unique build that fails half-way leaves an INVALID index behind.
        with pytest.raises(Exception, match="could not create unique index"):
            session.execute(f"CREATE UNIQUE INDEX CONCURRENTLY nw_test_invalid_idx ON {table} (dedupe_key)")
        with connection.cursor() as cursor:
            assert sql.postgresql.index_validity(cursor, table, "nw_test_invalid_idx") is False
    finally:
        session.execute("DROP INDEX IF EXISTS nw_test_invalid_idx")
        session.close()


def snapshot_sees_one_state_and_writes_nothing() -> None:
    """A row another connection commits inside the block is not seen by its reads; a write
    in it is refused (READ ONLY); already in a transaction it runs as it is (False)."""
    import threading

    from django.db import DatabaseError

    new_row("before")

    def commit_another() -> None:
        try:
            new_row("meanwhile")
        finally:
            connection.close()

    with sql.for_connection("default").read_only_snapshot("default") as snapshot:
        assert DeferredWork.objects.count() == 1
        thread = threading.Thread(target=commit_another)
        thread.start()
        thread.join()
        assert DeferredWork.objects.count() == 1
        with pytest.raises(DatabaseError), transaction.atomic():
            DeferredWork.objects.update(priority=1)
    assert snapshot is True
    assert DeferredWork.objects.count() == 2
    with transaction.atomic(), sql.for_connection("default").read_only_snapshot("default") as inner:
        assert inner is False


@pytest.mark.postgresql
def test_a_read_only_snapshot_on_postgresql() -> None:
    snapshot_sees_one_state_and_writes_nothing()


@pytest.mark.mysql
def test_a_read_only_snapshot_on_mariadb() -> None:
    snapshot_sees_one_state_and_writes_nothing()


def a_raw_transaction_is_left_open_and_read() -> None:
    """A transaction begun behind Django's back (a raw ``BEGIN``: a project's own, or a test's
    lagging replica) is not Django's to end: the block reads in it, yields False, and leaves
    it open. MariaDB refused the snapshot's ``SET TRANSACTION`` in it (1568: a server error
    on the admin list), and leaving the block rolled the caller's transaction back."""
    pk = new_row("raw")
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
    try:
        DeferredWork.objects.filter(pk=pk).update(priority=7)  # in it, not committed
        with sql.for_connection("default").read_only_snapshot("default") as snapshot:
            assert DeferredWork.objects.get(pk=pk).priority == 7
        assert snapshot is False
        assert DeferredWork.objects.get(pk=pk).priority == 7  # still open, still its write
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ROLLBACK")
    assert DeferredWork.objects.get(pk=pk).priority == 0


@pytest.mark.postgresql
def test_a_raw_transaction_is_left_open_on_postgresql() -> None:
    a_raw_transaction_is_left_open_and_read()


@pytest.mark.mysql
def test_a_raw_transaction_is_left_open_on_mariadb() -> None:
    a_raw_transaction_is_left_open_and_read()


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_claim_of_many_ids_binds_them_as_one_array() -> None:
    """A claim's statement is the same text whatever the number of ids beyond a few, so
    psycopg parses it once (a statement of over 50 placeholders it parsed at every claim,
    about 15 Python calls per id); a wake-up's few ids keep a placeholder each (its claim
    is compiled once with a slot per id). Both take exactly the rows named."""
    from nexus_workflows.sql.postgresql import PLACEHOLDER_IDS, claimable

    ids = [DeferredWork.objects.create(kind="k", dedupe_key=f"d{n}", trigger={}).pk for n in range(20)]
    pending = DeferredWork.objects.filter(status=Status.PENDING)
    few, many = claimable(pending, ids[:PLACEHOLDER_IDS]), claimable(pending, ids)
    (few_sql, few_params), (many_sql, many_params) = (
        queryset.query.get_compiler("default").as_sql() for queryset in (few, many)
    )
    assert few_sql.count("%s") == len(few_params) == PLACEHOLDER_IDS + 1  # and the status
    assert many_sql.count("%s") == len(many_params) == 2
    assert list(many_params[-1]) == ids
    assert claimable(pending, ids[:15]).query.get_compiler("default").as_sql()[0] == many_sql
    assert sorted(many.values_list("pk", flat=True)) == ids
    assert sorted(few.values_list("pk", flat=True)) == ids[:PLACEHOLDER_IDS]


def test_the_wake_up_claims_precompiled_ids_stay_placeholders_of_their_own() -> None:
    """The wake-up's claim by id is compiled once per number of ids, each id a slot that must
    appear once among the statement's parameters: a number bound as one array would break it."""
    from nexus_workflows.deferred.claims import _PRECOMPILED_IDS
    from nexus_workflows.sql.postgresql import PLACEHOLDER_IDS

    assert _PRECOMPILED_IDS <= PLACEHOLDER_IDS


@pytest.mark.django_db(transaction=True)
def test_of_ids_takes_exactly_the_rows_named() -> None:
    """The done-write's rows of a claim: on PostgreSQL beyond a few ids one array parameter
    (one statement text whatever their number), elsewhere ``IN``."""
    ids = [DeferredWork.objects.create(kind="k", dedupe_key=f"d{n}", trigger={}).pk for n in range(20)]
    every = DeferredWork.objects.all()
    module = sql.for_connection("default")
    for chosen in (ids[:3], ids[::2], ids):
        assert sorted(module.of_ids(every, chosen).values_list("pk", flat=True)) == sorted(chosen)
    if connection.vendor == "postgresql":
        twelve, twenty = (
            module.of_ids(every, n).query.get_compiler("default").as_sql() for n in (ids[:12], ids)
        )
        assert twelve[0] == twenty[0]
        assert len(twenty[1]) == 1


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True, databases=["default", "prepared"])
def test_many_ids_as_one_array_under_server_side_binding_and_prepared() -> None:
    """The README's prepared configuration (``server_side_binding``, ``prepare_threshold``
    5): psycopg binds the ids as an array of the smallest integer type that holds them
    (int2[] here, int8[] with an id past 2**31), cast to the key's type; the statements
    are prepared after their fifth run and take exactly the rows named each time."""
    from django.db import connections

    from nexus_workflows.sql.postgresql import claimable, of_ids

    ids = [DeferredWork.objects.create(kind="k", dedupe_key=f"d{n}", trigger={}).pk for n in range(20)]
    rows = DeferredWork.objects.using("prepared")
    for run in range(12):  # 6 runs of each array type: each statement prepared
        chosen = ids[run % 3 :] + ([2**40] if run % 2 else [])  # an id no row has, past 2**31
        expected = sorted(ids[run % 3 :])
        assert sorted(of_ids(rows.all(), chosen).values_list("pk", flat=True)) == expected
        pending = rows.filter(status=Status.PENDING)
        assert sorted(claimable(pending, chosen).values_list("pk", flat=True)) == expected
    with connections["prepared"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s", ["%= ANY($%"])
        assert cursor.fetchone()[0] >= 2

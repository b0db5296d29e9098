from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.db.models.signals import post_delete
from django.test import override_settings
from django.utils import timezone

from nexus_workflows import enqueue
from nexus_workflows.checks import check_settings
from nexus_workflows.database_errors import sqlstate
from nexus_workflows.deferred.retention import purge_batch, purge_expired
from nexus_workflows.deferred.runner.purging import Purging
from nexus_workflows.deferred.runner.stats import RunStats
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.numbers import MAX_SECONDS
from tests.processes import wait_for
from tests.raw_connections import raw_connection, row_locked

pytestmark = pytest.mark.django_db


def make_rows(status: Status, count: int, *, age: timedelta) -> None:
    then = timezone.now() - age
    DeferredWork.objects.bulk_create(
        DeferredWork(kind="k", dedupe_key=f"{status}-{age}-{n}", trigger={}, status=status, updated_at=then)
        for n in range(count)
    )


def test_finished_rows_are_purged_after_retention_and_nothing_else() -> None:
    day = timedelta(days=1)
    make_rows(Status.DONE, 3, age=day + timedelta(minutes=1))
    make_rows(Status.ABANDONED, 2, age=day + timedelta(minutes=1))
    make_rows(Status.DONE, 4, age=day - timedelta(minutes=1))
    make_rows(Status.PENDING, 5, age=day * 30)  # a long outage never loses pending work
    make_rows(Status.PROCESSING, 1, age=day * 30)
    assert purge_expired() == 5
    remaining = dict((status, DeferredWork.objects.filter(status=status).count()) for status in Status)
    assert remaining == {Status.DONE: 4, Status.ABANDONED: 0, Status.PENDING: 5, Status.PROCESSING: 1}


@override_settings(NEXUS_WORKFLOWS={"PURGE_BATCH_SIZE": 7})
def test_purge_works_in_bounded_batches() -> None:
    make_rows(Status.DONE, 20, age=timedelta(days=2))
    assert purge_batch() == 7
    assert DeferredWork.objects.count() == 13
    assert purge_expired() == 13


def test_the_dedupe_horizon_is_the_retention(register_workflow: Any) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    DeferredWork.objects.filter(pk=work_id).update(status=Status.DONE)
    assert enqueue(kind, {"key": "a"}) is None  # within the horizon
    with override_settings(NEXUS_WORKFLOWS={"RETENTION": 3600}):
        DeferredWork.objects.filter(pk=work_id).update(updated_at=timezone.now() - timedelta(hours=2))
        assert purge_expired() == 1
    assert enqueue(kind, {"key": "a"}) not in (None, work_id)  # the key is free again


def revive_just_before_the_delete(pk: int) -> Any:
    """An execute wrapper: just before the purge's DELETE, another connection revives row
    ``pk`` and commits, inside the window between the purge's read and its DELETE."""

    def revive() -> None:
        try:
            revived = {"status": Status.PENDING, "attempt": 0, "updated_at": timezone.now()}
            DeferredWork.objects.filter(pk=pk).update(**revived)
        finally:
            connection.close()

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith("DELETE"):
            thread = threading.Thread(target=revive)
            thread.start()
            thread.join()
        return execute(sql, params, many, context)

    return wrapper


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("receiver_connected", [True, False], ids=["post-delete-receiver", "no-receiver"])
def test_a_row_revived_between_the_purge_read_and_its_delete_survives(receiver_connected: bool) -> None:
    """The DELETE itself re-checks status and expiry. Django's collector (used whenever a
    delete receiver is connected) deletes by primary key only, so it would take the row."""
    make_rows(Status.ABANDONED, 3, age=timedelta(days=2))
    revived_pk = DeferredWork.objects.order_by("pk").values_list("pk", flat=True).first()
    deleted_seen: list[int] = []

    def receiver(sender: Any, instance: DeferredWork, **kwargs: Any) -> None:
        deleted_seen.append(instance.pk)

    if receiver_connected:
        post_delete.connect(receiver, sender=DeferredWork)
    try:
        with connection.execute_wrapper(revive_just_before_the_delete(revived_pk)):
            deleted = purge_batch()
    finally:
        post_delete.disconnect(receiver, sender=DeferredWork)
    assert deleted == 2
    assert list(DeferredWork.objects.values_list("pk", "status")) == [(revived_pk, Status.PENDING)]
    assert revived_pk not in deleted_seen


def statement_timeout(milliseconds: int) -> None:
    """For the rest of the test's transaction (pytest-django rolls it back)."""
    with connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL statement_timeout = {milliseconds}")


@contextmanager
def only_the_prune_times_out(milliseconds: int) -> Iterator[None]:
    """``statement_timeout`` for the prune's ``DELETE`` of rate-window rows alone; every
    other statement (the purge's read, the test's own count) without one. On a loaded
    machine (load 14-18 on two cores) a ``COUNT(*)`` took over 100 ms: a session-wide tiny
    timeout cancelled what the test did not mean to. The prune runs in a savepoint, so a
    cancel's rollback takes the ``SET LOCAL`` back with it; one that passes resets it."""
    from nexus_workflows.models import FlowWindowSlot

    table = FlowWindowSlot._meta.db_table

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not (sql.lstrip().upper().startswith("DELETE") and table in sql):
            return execute(sql, params, many, context)
        context["cursor"].execute(f"SET LOCAL statement_timeout = {milliseconds}")
        result = execute(sql, params, many, context)
        context["cursor"].execute("SET LOCAL statement_timeout TO DEFAULT")
        return result

    with connection.execute_wrapper(wrapper):
        yield


@pytest.mark.postgresql
@override_settings(NEXUS_WORKFLOWS={"PURGE_BATCH_SIZE": 40, "PURGE_BATCH_SECONDS": 60})
def test_purge_expired_halves_a_batch_the_database_cancels(slow_deletes: Any, caplog: Any) -> None:
    """A batch over statement_timeout (SQLSTATE 57014) is tried again at half the size,
    inside the caller's transaction too (each batch is a savepoint of its own)."""
    make_rows(Status.DONE, 60, age=timedelta(days=2))
    # PURGE_BATCH_SECONDS 60: only the timeout limits the batches; the first (10 rows, 0.1 s)
    # ramps straight up to 40. 40 rows sleep 0.4 s at least (cancelled at 0.38 s, however
    # loaded the machine); 20 rows take 0.21 s, 170 ms under the timeout (at 300 ms, a stall
    # of 90 ms would halve them again); then, over half the timeout, smaller ones.
    slow_deletes.install(0.01)
    statement_timeout(380)
    with caplog.at_level(logging.WARNING, logger="nexus_workflows"):
        assert purge_expired() == 60
    assert DeferredWork.objects.count() == 0  # the transaction is still usable
    assert [record.getMessage() for record in caplog.records] == [
        "a purge batch of 40 rows was cancelled by the database (statement_timeout?); "
        "purging 20 rows at a time from now on"
    ]


@pytest.mark.postgresql
@override_settings(NEXUS_WORKFLOWS={"PURGE_BATCH_SIZE": 2})
def test_purge_expired_says_which_setting_when_even_one_row_is_cancelled(slow_deletes: Any) -> None:
    make_rows(Status.DONE, 3, age=timedelta(days=2))
    slow_deletes.install(0.1)
    statement_timeout(50)
    with pytest.raises(OperationalError, match="one row's DELETE takes longer than statement_timeout allows"):
        purge_expired()
    assert DeferredWork.objects.count() == 3


@pytest.mark.postgresql
def test_a_cancelled_prune_of_rate_window_rows_does_not_shrink_the_purge_batches(caplog: Any) -> None:
    """With nothing expired, a purge batch prunes old rate-window rows instead (one
    unbounded DELETE of another table). The database cancelling that says nothing about
    the size of the work table's batches: they must not halve, nor be reported as a purge
    batch cancelled."""
    from nexus_workflows.deferred.purge_batches import FIRST_SIZE, PurgeBatchSize
    from nexus_workflows.deferred.retention import purge_sized_batch
    from nexus_workflows.models import FlowWindowSlot

    slow_window_prune()
    sizes = PurgeBatchSize(1000, 0.5)
    with caplog.at_level(logging.WARNING, logger="nexus_workflows"), only_the_prune_times_out(200):
        purge_sized_batch(sizes)
    assert (sizes.size, sizes.was_cancelled) == (FIRST_SIZE, False)
    assert [r.getMessage() for r in caplog.records] == [
        "pruning unused rate-window rows was cancelled by the database (statement_timeout?); "
        "trying again at the next purge"
    ]
    assert FlowWindowSlot.objects.count() == 1  # rolled back; the transaction is still usable


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_row_revived_during_a_purge_survives_under_repeatable_read() -> None:
    """Outside a transaction the purge's read and its DELETE are two statements of their
    own: a session whose transactions are REPEATABLE READ then sees the revive at the
    DELETE, whose re-check keeps the row. In one transaction the DELETE would meet a row
    changed since the read's snapshot: SerializationFailure, and nothing purged."""
    make_rows(Status.ABANDONED, 3, age=timedelta(days=2))
    revived_pk = DeferredWork.objects.order_by("pk").values_list("pk", flat=True).first()

    with connection.cursor() as cursor:
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    try:
        with connection.execute_wrapper(revive_just_before_the_delete(revived_pk)):
            assert purge_expired() == 2
    finally:
        connection.close()  # the session's isolation goes with it
    assert list(DeferredWork.objects.values_list("pk", "status")) == [(revived_pk, Status.PENDING)]


@pytest.mark.postgresql
@override_settings(NEXUS_WORKFLOWS={"PURGE_BATCH_SIZE": 10})
def test_a_cancelled_batch_tells_the_sizes_the_sessions_real_statement_timeout(slow_deletes: Any) -> None:
    """Not how long the cancelled batch ran (0.38 s), which a pg_cancel_backend would make
    as short as it came early: the session's statement_timeout, read after the cancel."""
    from nexus_workflows.deferred.purge_batches import PurgeBatchSize
    from nexus_workflows.deferred.retention import purge_sized_batch

    make_rows(Status.DONE, 10, age=timedelta(days=2))
    slow_deletes.install(0.05)  # 10 rows: 0.5 s
    statement_timeout(380)
    sizes = PurgeBatchSize(10, 60.0)
    assert purge_sized_batch(sizes) is None
    assert (sizes.size, sizes.statement_limit, sizes.budget) == (5, 0.38, 0.19)


def cancel_the_delete_of(pid: int) -> threading.Thread:
    """A thread that cancels session ``pid``'s first DELETE (pg_cancel_backend), from a
    connection of its own, as someone might by hand."""

    def cancel() -> None:
        with raw_connection() as other:

            def deleting() -> bool:
                row = other.execute(
                    "SELECT query LIKE 'DELETE%%' FROM pg_stat_activity WHERE pid = %s AND state = 'active'",
                    [pid],
                ).fetchone()
                return bool(row and row[0])

            wait_for(deleting, timeout=30, interval=0.01, what="the purge's DELETE")
            other.execute("SELECT pg_cancel_backend(%s)", [pid])

    thread = threading.Thread(target=cancel)
    thread.start()
    return thread


@pytest.mark.postgresql
def test_a_batch_cancelled_by_hand_without_a_statement_timeout_leaves_the_budget_to_the_target(
    slow_deletes: Any,
) -> None:
    """statement_timeout 0: a cancel says nothing of what one statement may take. The size
    halves (the runner cannot tell a cancel by hand from a timeout), the budget stays."""
    from nexus_workflows.deferred.purge_batches import PurgeBatchSize
    from nexus_workflows.deferred.retention import purge_sized_batch

    make_rows(Status.DONE, 10, age=timedelta(days=2))
    slow_deletes.install(0.05)  # 10 rows: 0.5 s, time to see the DELETE and cancel it
    statement_timeout(0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    sizes = PurgeBatchSize(10, 0.5)
    thread = cancel_the_delete_of(pid)
    try:
        assert purge_sized_batch(sizes) is None
    finally:
        thread.join()
    assert (sizes.size, sizes.statement_limit, sizes.budget) == (5, None, 0.5)
    assert DeferredWork.objects.count() == 10


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
@override_settings(NEXUS_WORKFLOWS={"PURGE_BATCH_SIZE": 10})
def test_purge_expired_tries_a_batch_that_met_a_lock_once_more_then_raises(caplog: Any) -> None:
    """Another session holds a row lock past this session's lock_timeout (SQLSTATE 55P03):
    no outage and no smaller batch, the same batch once more; then the error, and nothing
    purged (each DELETE is one statement, undone whole)."""
    make_rows(Status.DONE, 5, age=timedelta(days=2))
    table = connection.ops.quote_name(DeferredWork._meta.db_table)
    with raw_connection() as other:
        other.execute("BEGIN")
        other.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE", [DeferredWork.objects.first().pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 100")
        try:
            with (
                caplog.at_level(logging.WARNING, logger="nexus_workflows"),
                pytest.raises(OperationalError) as raised,
            ):
                purge_expired()
        finally:
            connection.close()  # the session's lock_timeout goes with it
    assert sqlstate(raised.value) == "55P03"
    assert [record.getMessage() for record in caplog.records] == [
        "a purge batch did not pass (it waited longer than lock_timeout for a lock); trying it once more"
    ]
    assert DeferredWork.objects.count() == 5


def hold_row_lock(other: Any, model: Any, pk: int) -> None:
    """``other`` (a raw session) locks one row of ``model`` in a transaction it keeps open."""
    other.execute("BEGIN")
    other.execute(
        f"SELECT 1 FROM {connection.ops.quote_name(model._meta.db_table)} WHERE id = %s FOR UPDATE", [pk]
    )


def session_lock_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        return str(cursor.fetchone()[0])


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("session_setting", "waits_under"),
    [(None, 0.45), ("statement_timeout = 300", 0.3)],
    ids=["no lock_timeout", "statement_timeout under twice the bound"],
)
def test_a_runner_batch_waits_for_a_lock_at_most_its_bound(
    session_setting: str | None, waits_under: float
) -> None:
    """The session has no lock_timeout (waits for ever) and another holds a row lock: with
    ``lock_wait`` (the runner's), the batch gives up after 0.2 s as a conflict (55P03), its
    size untouched, and the session's own lock_timeout is as it was. Under a statement_timeout
    of 300 ms the bound is 0.5 s, yet the wait ends at half that timeout as a conflict, not a
    cancel (57014), which would halve the batches for what their size did not cause."""
    from nexus_workflows.deferred.purge_batches import FIRST_SIZE, PurgeBatchSize
    from nexus_workflows.deferred.retention import purge_sized_batch

    make_rows(Status.DONE, 5, age=timedelta(days=2))
    sizes = PurgeBatchSize(1000, 0.5)
    with raw_connection() as other:
        hold_row_lock(other, DeferredWork, DeferredWork.objects.order_by("pk")[2].pk)
        try:
            if session_setting is not None:
                with connection.cursor() as cursor:
                    cursor.execute(f"SET {session_setting}")
            started = time.monotonic()
            with pytest.raises(OperationalError) as raised:
                purge_sized_batch(sizes, lock_wait=0.2 if session_setting is None else 0.5)
            waited = time.monotonic() - started
            assert session_lock_timeout() == "0"
        finally:
            connection.close()  # the session's settings go with it
    assert sqlstate(raised.value) == "55P03"
    assert waited < waits_under
    assert (sizes.size, sizes.was_cancelled) == (FIRST_SIZE, False)
    assert DeferredWork.objects.count() == 5  # the DELETE is undone whole


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_purge_expired_waits_for_a_lock_as_the_session_says_not_the_runners_bound() -> None:
    """``purge_expired()`` holds up no claims, only its caller, who asked for every expired
    row gone: with no lock_timeout it waits for the lock (here 1.5 s, three times
    PURGE_BATCH_SECONDS) and then purges every row."""
    make_rows(Status.DONE, 5, age=timedelta(days=2))
    table = connection.ops.quote_name(DeferredWork._meta.db_table)
    with raw_connection() as other, raw_connection() as watcher:
        hold_row_lock(other, DeferredWork, DeferredWork.objects.order_by("pk")[2].pk)

        def release_once_waited_for() -> None:
            wait_for(
                lambda: watcher.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE %s",
                    [f"DELETE FROM {table}%"],
                ).fetchone(),
                timeout=10,
                what="the purge waiting for the lock",
            )
            time.sleep(1.5)  # the lock is held on: this is what is measured
            other.execute("ROLLBACK")

        releaser = threading.Thread(target=release_once_waited_for)
        releaser.start()
        started = time.monotonic()
        try:
            assert purge_expired() == 5
        finally:
            releaser.join()
    assert time.monotonic() - started >= 1.5
    assert DeferredWork.objects.count() == 0


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_a_prune_of_rate_window_rows_meeting_a_lock_waits_at_most_the_bound(caplog: Any) -> None:
    """A slot row is locked for long (a project's transaction that called ``rate_limited()``
    on a key unused for its period, and stays open): the prune gives up after the bound,
    says so, and the next purge prunes the row once the lock is gone."""
    from nexus_workflows.deferred.purge_batches import PurgeBatchSize
    from nexus_workflows.deferred.retention import purge_sized_batch
    from nexus_workflows.models import FlowWindowSlot

    slot = FlowWindowSlot.objects.create(name="gone", slot=0, started_at=timezone.now() - timedelta(days=800))
    sizes = PurgeBatchSize(1000, 0.5)
    with raw_connection() as other:
        hold_row_lock(other, FlowWindowSlot, slot.pk)
        with caplog.at_level(logging.WARNING, logger="nexus_workflows"):
            assert purge_sized_batch(sizes, lock_wait=0.2) == 0
        assert FlowWindowSlot.objects.count() == 1
        other.execute("ROLLBACK")
    assert [record.getMessage() for record in caplog.records] == [
        "pruning unused rate-window rows did not pass (it waited longer than lock_timeout for a lock); "
        "trying again at the next purge"
    ]
    assert purge_sized_batch(sizes, lock_wait=0.2) == 0
    assert FlowWindowSlot.objects.count() == 0


@pytest.mark.django_db(transaction=True)
@override_settings(NEXUS_WORKFLOWS={"PURGE_BATCH_SECONDS": MAX_SECONDS})
def test_a_runner_purges_with_the_longest_batch_budget_the_checks_accept() -> None:
    """PURGE_BATCH_SECONDS is also the most a runner's batch waits for a lock. Ten years
    passes the system check, and is more than PostgreSQL's lock_timeout holds (2,147,483,647
    ms, 24.8 days): the wait is that at most, instead of every purge failing (DataError)
    and expired rows staying for ever."""
    assert not [message for message in check_settings() if "PURGE_BATCH_SECONDS" in message.msg]
    make_rows(Status.DONE, 3, age=timedelta(days=2))
    make_rows(Status.DONE, 1, age=timedelta(hours=1))
    try:
        more = Purging("default", RunStats()).batch()
    finally:
        connection.close()  # the session's settings go with it
    assert more is False
    assert DeferredWork.objects.count() == 1


@pytest.mark.needs("row_locks")
@pytest.mark.django_db(transaction=True)
@override_settings(NEXUS_WORKFLOWS={"PURGE_BATCH_SECONDS": 0.2})
def test_a_runner_says_once_that_a_held_lock_keeps_its_prune_back_as_for_a_batch(caplog: Any) -> None:
    """A slot row locked for long holds the runner's prune back at every purge (once a
    sweep): a WARNING when it starts, DEBUG while it lasts, nothing when it passes, as a
    batch's conflict; a lock held again later is said again."""
    from nexus_workflows.models import FlowWindowSlot

    def held_for_three_purges() -> None:
        old = timezone.now() - timedelta(days=800)
        slot = FlowWindowSlot.objects.create(name="gone", slot=0, started_at=old)
        with row_locked(FlowWindowSlot, slot.pk):
            for _ in range(3):
                assert purging.batch() is False
            assert FlowWindowSlot.objects.count() == 1
        assert purging.batch() is False  # the lock is gone: the prune passes
        assert FlowWindowSlot.objects.count() == 0

    purging = Purging("default", RunStats())
    try:
        with caplog.at_level(logging.DEBUG, logger="nexus_workflows"):
            held_for_three_purges()
            held_for_three_purges()
    finally:
        connection.close()  # the session's settings go with it
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "rate-window" in r.getMessage()]
    assert [level for level, _ in said] == ["WARNING", "DEBUG", "DEBUG"] * 2, said
    assert all(message.startswith("pruning unused rate-window rows did not pass") for _, message in said)


@pytest.mark.postgresql
def test_a_runner_says_once_that_statement_timeout_cancels_its_prune_as_for_a_held_lock(caplog: Any) -> None:
    """A rate-window table too big to prune within statement_timeout is cancelled at every
    purge (once a sweep), for as long as it stays that big: said once (WARNING), then
    quietly (DEBUG) while it lasts, as a held lock is; said again after one passed. It
    was a WARNING at every purge."""
    from nexus_workflows.models import FlowWindowSlot

    table = slow_window_prune()
    purging = Purging("default", RunStats())
    # 500 ms: on a loaded CI machine, the passing prune's one-row DELETE took over 100 ms.
    with caplog.at_level(logging.DEBUG, logger="nexus_workflows"), only_the_prune_times_out(500):
        for _ in range(3):
            assert purging.batch() is False
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER nw_test_slow_prune ON {table}")
        assert purging.batch() is False  # it passes
        assert FlowWindowSlot.objects.count() == 0
        FlowWindowSlot.objects.create(name="gone", slot=0, started_at=timezone.now() - timedelta(days=800))
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE TRIGGER nw_test_slow_prune BEFORE DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION nw_test_slow_prune()"
            )
        assert purging.batch() is False
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "rate-window" in r.getMessage()]
    assert [level for level, _ in said] == ["WARNING", "DEBUG", "DEBUG", "WARNING"], said
    assert all("statement_timeout" in message for _, message in said), said


def _blocks_read(node: dict[str, Any]) -> int:
    """Shared blocks one plan node and its children touched (EXPLAIN's BUFFERS)."""
    own = node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
    return own if "Plans" not in node else max(own, sum(_blocks_read(child) for child in node["Plans"]))


@pytest.mark.postgresql
def test_the_purge_reads_only_expired_entries_of_its_index() -> None:
    """The purge's read of expired ids must not walk every finished row's index entry:
    ``status IN (done, abandoned)`` is implied by ``nw_expiry_idx``'s predicate, so
    PostgreSQL drops it from the index condition and a read by ``updated_at`` alone scans
    the whole index, on every sweep of a table with nothing expired too."""
    from django.test.utils import CaptureQueriesContext

    now = timezone.now()
    DeferredWork.objects.bulk_create(  # finished within the retention, each at its own time
        DeferredWork(
            kind="k",
            dedupe_key=f"recent-{n}",
            trigger={},
            status=Status.ABANDONED if n % 4 == 0 else Status.DONE,
            updated_at=now - timedelta(seconds=n),
        )
        for n in range(20_000)
    )
    make_rows(Status.DONE, 3, age=timedelta(days=2))
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {DeferredWork._meta.db_table}")
    with CaptureQueriesContext(connection) as queries:
        assert purge_batch(prune=False) == 3
        assert purge_batch(prune=False) == 0
    reads = [query["sql"] for query in queries.captured_queries if query["sql"].startswith("SELECT")]
    assert reads
    with connection.cursor() as cursor:
        for read in reads:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {read}")
            blocks = _blocks_read(cursor.fetchone()[0][0]["Plan"])
            # Reading the few expired entries takes a handful of index pages; the whole
            # index of 20,000 finished rows takes well over a hundred.
            assert blocks < 20, f"{blocks} blocks to read expired ids: {read[:200]}"


def slow_window_prune() -> str:
    """One expired rate-window row whose delete takes 30 s (a trigger), so a prune of
    it outlasts any short ``statement_timeout``. In the test's transaction: its rollback
    drops the function and the trigger. Returns the table's quoted name."""
    from nexus_workflows.models import FlowWindowSlot

    FlowWindowSlot.objects.create(name="gone", slot=0, started_at=timezone.now() - timedelta(days=800))
    table = connection.ops.quote_name(FlowWindowSlot._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION nw_test_slow_prune() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN PERFORM pg_sleep(30); RETURN OLD; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER nw_test_slow_prune BEFORE DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION nw_test_slow_prune()"
        )
    return table

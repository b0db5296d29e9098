"""Migrations 0007, 0008, 0010, 0014 and 0016 build their indexes on the work table without
blocking writes on PostgreSQL (CREATE/DROP INDEX CONCURRENTLY), are re-runnable after an
interrupted build, and give the same schema as the ordinary operations everywhere."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.utils import OperationalError

from nexus_workflows.models import DeferredWork
from tests.migrating import (
    APP,
    TABLE,
    index_definitions,
    migrate,
    migrate_in_thread,
    recorded,
    validity,
    waiting_index_statements,
)
from tests.processes import wait_for
from tests.raw_connections import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

WORK_TABLE_INDEXES = (
    "nw_serial_idx",
    "nw_due_idx",
    "nw_task_result_idx",
    "nw_expiry_idx",
    "nw_flow_slot_held_once",
)


def test_going_back_to_0006_and_forward_again_gives_the_same_indexes() -> None:
    """On every database: the migrations whose indexes are now built concurrently (on
    PostgreSQL) reverse and re-apply, and the indexes are the ones the models declare."""
    DeferredWork.objects.create(kind="k", dedupe_key="a", trigger={})
    before = index_definitions()
    try:
        migrate("0006_minimum_necessary")
        assert not {name for name in index_definitions() if name in {"nw_serial_idx", "nw_task_result_idx"}}
    finally:
        migrate(None)
    assert index_definitions() == before
    assert DeferredWork.objects.filter(dedupe_key="a").exists()


@pytest.mark.postgresql
def test_migration_0014_lets_inserts_go_on_while_a_transaction_holds_the_table() -> None:
    """A session holds an open transaction that writes the work table (its insert's ROW
    EXCLUSIVE lock) while 0014 rebuilds nw_due_idx. A plain DROP/CREATE INDEX queues for
    a lock that conflicts with every writer, and every later insert queues behind it: an
    enqueue waited for the other transaction. Concurrently, another insert goes through."""
    migrate("0013_mysql_exact_text")
    holder = raw_connection()
    watcher = raw_connection()
    failures: list[Exception] = []
    thread = None
    try:
        holder.execute("BEGIN")
        holder.execute(f"LOCK TABLE {TABLE} IN ROW EXCLUSIVE MODE")  # what an insert takes
        thread = migrate_in_thread("0014_due_index_status_first", failures)
        wait_for(lambda: waiting_index_statements(watcher), timeout=30, what="the migration waiting")
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")
        try:
            DeferredWork.objects.create(kind="k", dedupe_key="during the migration", trigger={})
        except OperationalError as error:
            pytest.fail(f"an insert waited for the index build: {type(error).__name__}")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        holder.execute("COMMIT")
        thread.join(timeout=60)
    finally:
        holder.close()
        watcher.close()
        if thread is not None:
            thread.join(timeout=60)
        migrate(None)
    assert not failures, failures
    assert (APP, "0014_due_index_status_first") in recorded()
    assert validity("nw_due_idx") is True


@pytest.mark.postgresql
def test_an_interrupted_concurrent_build_leaves_an_invalid_index_that_the_next_run_rebuilds() -> None:
    """0007's first concurrent build (the partial unique index of nw_flow_slot_held_once)
    is cancelled while it waits for an older transaction:
    PostgreSQL keeps an INVALID index of that name and the migration is not recorded,
    though its other operations (one transaction) were committed. Running migrate again
    skips what was committed, drops the invalid index and builds it."""
    migrate("0006_minimum_necessary")
    holder = raw_connection()
    watcher = raw_connection()
    failures: list[Exception] = []
    thread = None
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        # A snapshot the build must wait out, taken on another table: a lock on the work
        # table would hold back the migration's ALTER TABLE before the build.
        holder.execute("SELECT count(*) FROM django_migrations")
        thread = migrate_in_thread("0007_flow_control", failures)

        def building() -> Any:
            return watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND query ILIKE 'CREATE UNIQUE INDEX CONCURRENTLY%%nw_flow_slot_held_once%%' "
                "AND wait_event_type = 'Lock'"
            ).fetchone()

        (pid,) = wait_for(building, timeout=30, what="the concurrent build waiting")
        watcher.execute("SELECT pg_cancel_backend(%s)", [pid])
        thread.join(timeout=60)
        holder.execute("COMMIT")
        assert failures, "the cancelled build did not fail the migration"
        assert validity("nw_flow_slot_held_once") is False
        assert (APP, "0007_flow_control") not in recorded()
        migrate("0007_flow_control")
        assert validity("nw_flow_slot_held_once") is True
        assert validity("nw_serial_idx") is True
        assert (APP, "0007_flow_control") in recorded()
    finally:
        holder.close()
        watcher.close()
        if thread is not None:
            thread.join(timeout=60)
        migrate(None)
    assert validity("nw_serial_idx") is True


@pytest.mark.postgresql
def test_every_index_on_the_work_table_from_0007_on_is_built_and_dropped_concurrently() -> None:
    """Going back to 0006 and forward again (both ways), every CREATE [UNIQUE] INDEX and
    DROP INDEX on the work table says CONCURRENTLY: the indexes of 0007, 0008, 0010, 0014
    and 0016, and 0007's two partial unique constraints (built as unique indexes)."""
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as backwards:
        migrate("0006_minimum_necessary")
    with CaptureQueriesContext(connection) as forwards:
        migrate(None)
    statements = [q["sql"] for q in [*backwards.captured_queries, *forwards.captured_queries]]
    on_table = [
        sql
        for sql in statements
        if sql.upper().startswith(("CREATE INDEX", "CREATE UNIQUE INDEX", "DROP INDEX"))
        and (TABLE in sql or any(name in sql for name in (*WORK_TABLE_INDEXES, "nw_serial_key_running_once")))
    ]
    names = " ".join(on_table)
    for name in (
        "nw_serial_idx",
        "nw_due_idx",
        "nw_task_result_idx",
        "nw_expiry_idx",
        "nw_flow_slot_held_once",
        "nw_due_kind_idx",
        "nw_due_queue_idx",
    ):
        assert name in names, name
    blocking = [sql for sql in on_table if "CONCURRENTLY" not in sql.upper()]
    assert not blocking, blocking

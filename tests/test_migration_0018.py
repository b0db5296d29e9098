"""Migration 0018 builds MariaDB's own due indexes per kind and per task queue (and nothing
elsewhere), outside the model state; back and forth, and run again, it leaves them as
``sql.mysql.DUE_INDEXES`` declares."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.autodetector import MigrationAutodetector
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.state import ProjectState

from nexus_workflows.models import DeferredWork
from nexus_workflows.sql import mysql
from tests.migrating import index_definitions, migrate, migrate_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

MARIADB_INDEXES = {
    "nw_mariadb_due_kind_idx": ["status", "kind", "priority", "next_attempt_at"],
    "nw_mariadb_due_queue_idx": ["status", "queue_name", "priority", "next_attempt_at"],
}


def _built() -> dict[str, list[str]]:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, DeferredWork._meta.db_table)
    return {name: c["columns"] for name, c in constraints.items() if name in MARIADB_INDEXES}


def test_back_and_forth_builds_the_indexes_on_mariadb_only() -> None:
    DeferredWork.objects.create(kind="k", dedupe_key="a", trigger={})
    before = index_definitions()
    try:
        migrate("0017_notify_resting_limited_kinds")
        assert _built() == {}
    finally:
        migrate(None)
    assert _built() == (MARIADB_INDEXES if connection.vendor == "mysql" else {})
    assert index_definitions() == before
    assert DeferredWork.objects.filter(dedupe_key="a").exists()


@pytest.mark.mysql
def test_on_mariadb_the_priority_is_descending_and_a_second_run_changes_nothing() -> None:
    """The claim's order (priority DESC, then the due time) is the indexes' own, so each
    read stops at its limit; a second build (a migration run again after an interruption)
    keeps them as they are."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT INDEX_NAME, COLUMN_NAME, COLLATION FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s AND INDEX_NAME LIKE 'nw\\_mariadb\\_%%' "
            "ORDER BY INDEX_NAME, SEQ_IN_INDEX",
            [DeferredWork._meta.db_table],
        )
        orders = {(name, column): order for name, column, order in cursor.fetchall()}
    assert {column for (_, column), order in orders.items() if order == "D"} == {"priority"}
    before = index_definitions()
    with connection.schema_editor() as editor:
        mysql.add_due_indexes(editor, DeferredWork._meta.db_table)
    assert index_definitions() == before


def test_the_model_state_does_not_know_the_indexes() -> None:
    """Outside the model state: the models and the migrations agree (no migration to make),
    whatever the vendor."""
    from django.apps import apps

    loader = MigrationExecutor(connection).loader
    detector = MigrationAutodetector(loader.project_state(), ProjectState.from_apps(apps))
    assert "nexus_workflows" not in detector.changes(graph=loader.graph)


def _run_behind_an_open_transaction(
    target: str, *, lock_wait: float, margin: float
) -> tuple[bool, list[Exception]]:
    """``migrate(target)`` in a thread while another session keeps open a transaction that
    read the work table (its metadata lock, which an online ALTER still needs for a moment
    at its start and end): (whether it was still waiting after ``lock_wait`` + ``margin``,
    what it raised)."""
    import MySQLdb

    session = MySQLdb.connect(**connection.get_connection_params())
    failures: list[Exception] = []
    try:
        cursor = session.cursor()
        cursor.execute("START TRANSACTION")
        cursor.execute(f"SELECT COUNT(*) FROM {DeferredWork._meta.db_table}")
        thread = migrate_in_thread(target, failures)
        thread.join(timeout=lock_wait + margin)
        stuck = thread.is_alive()
        session.rollback()
        thread.join(timeout=60)
    finally:
        session.close()
    return stuck, failures


@pytest.mark.mysql
def test_on_mariadb_the_build_behind_an_open_transaction_gives_up_after_its_bound() -> None:
    """Waiting for the metadata lock, an ALTER holds every later statement on the table
    (enqueues, claims, reads) behind it; the server's own bound is a day
    (``lock_wait_timeout``). The build waits at most ``sql.mysql.DDL_LOCK_WAIT`` seconds,
    fails (nothing built, error 1205), and is run again."""
    from django.db.utils import OperationalError

    migrate("0017_notify_resting_limited_kinds")
    try:
        stuck, failures = _run_behind_an_open_transaction(
            "0018_mariadb_due_per_kind_and_queue", lock_wait=5.0, margin=10.0
        )
        assert not stuck, "the build waited for the table's metadata lock beyond its bound"
        assert [type(error) for error in failures] == [OperationalError]
        assert failures[0].args[0] == 1205
        assert _built() == {}
    finally:
        migrate(None)
    assert _built() == MARIADB_INDEXES

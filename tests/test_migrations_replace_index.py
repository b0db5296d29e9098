"""Migration 0014 replaces nw_due_idx (status first) without leaving claims a moment without
a due index: the new index is built first under a temporary name, then the old one dropped
and the new one renamed; each step is skipped by a run again after an interruption."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext

from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.models import DeferredWork
from nexus_workflows.sql import postgresql
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

MIGRATION = "0014_due_index_status_first"
DUE_INDEXES = ("nw_due_idx", "nw_due_idx_swap")


def _claim_query(register_workflow: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The SELECT of a claim of due work (the due rows in nw_due_idx's order), as sent by
    the runners still running while 0014 migrates: those of a release before 0016, whose
    claim read nw_due_idx (this release's reads the per-kind indexes 0016 adds, see
    sql.postgresql.due_ids, which answers None here so that the ORM's read is sent)."""
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    DeferredWork.objects.create(kind=kind, dedupe_key="due", trigger={})
    monkeypatch.setattr(postgresql, "due_ids", lambda *args: None)
    with CaptureQueriesContext(connection) as queries:
        Claimer(kinds=[kind], using="default").claim_due(5)
    selects = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    return next(sql for sql in selects if TABLE in sql and "ORDER BY" in sql)


def _due_index_of_plan(session: Any, claim: str) -> str | None:
    """The due index the planner reads for the claim (any other plan: None). Sequential
    scans are priced out, so any usable due index is taken: the table is small."""
    plan = "\n".join(row[0] for row in session.execute(f"EXPLAIN {claim}").fetchall())
    return next((name for name in reversed(DUE_INDEXES) if name in plan), None)


@pytest.mark.postgresql
def test_migration_0014_leaves_the_claim_a_due_index_at_every_moment(
    register_workflow: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While 0014 runs, held up by a transaction that writes the work table, and until it
    ends, the claim's plan reads nw_due_idx or the new index under its temporary name.
    Dropping the old index first left the claim a sequential scan for the whole build."""
    claim = _claim_query(register_workflow, monkeypatch)
    migrate("0013_mysql_exact_text")
    holder, planner, watcher = raw_connection(), raw_connection(), raw_connection()
    planner.execute("SET enable_seqscan = off")
    # The table's statistics as they are now: an earlier test's (thousands of rows, since
    # flushed) made the planner prefer the primary key's index over any due index.
    planner.execute(f"ANALYZE {TABLE}")
    failures: list[Exception] = []
    plans: list[str | None] = []
    thread = None
    try:
        holder.execute("BEGIN")
        holder.execute(f"LOCK TABLE {TABLE} IN ROW EXCLUSIVE MODE")  # what an insert takes
        thread = migrate_in_thread(MIGRATION, failures)
        wait_for(lambda: waiting_index_statements(watcher), timeout=30, what="0014 waiting on the holder")
        for _ in range(5):
            plans.append(_due_index_of_plan(planner, claim))
        holder.execute("COMMIT")
        while thread.is_alive():
            plans.append(_due_index_of_plan(planner, claim))
        plans.append(_due_index_of_plan(planner, claim))
    finally:
        holder.close()
        watcher.close()
        planner.close()
        if thread is not None:
            thread.join(timeout=60)
        migrate(None)
    assert not failures, failures
    assert None not in plans, f"{plans.count(None)} of {len(plans)} claim plans read no due index"
    assert plans[-1] == "nw_due_idx"


def _interrupted_after(steps: int) -> None:
    """0014's first ``steps`` steps done, the migration not recorded: what a run stopped
    after them leaves."""
    from nexus_workflows.index_operations import IndexSwap  # here: the other tests run on old code

    executor = MigrationExecutor(connection)
    before = executor.loader.project_state((APP, "0013_mysql_exact_text"))
    after = executor.loader.project_state((APP, MIGRATION))
    old = before.models[APP, "deferredwork"].get_index_by_name("nw_due_idx")
    new = after.models[APP, "deferredwork"].get_index_by_name("nw_due_idx")
    model = after.apps.get_model(APP, "deferredwork")
    with connection.schema_editor(atomic=False) as editor:
        for step in IndexSwap(editor, model, old, new).steps()[:steps]:
            step()


@pytest.mark.needs("index_rename")
@pytest.mark.parametrize("steps", [1, 2, 3])
def test_migration_0014_run_again_after_an_interruption_finishes_the_swap(steps: int) -> None:
    """Stopped after building the new index, after dropping the old one, or after the
    rename (before the migration is recorded): migrate again gives the indexes a run
    without interruption gives, and records 0014."""
    expected = index_definitions()
    DeferredWork.objects.create(kind="k", dedupe_key="a", trigger={})
    try:
        migrate("0013_mysql_exact_text")
        _interrupted_after(steps)
        assert (APP, MIGRATION) not in recorded()
        names = set(index_definitions())
        assert names & set(DUE_INDEXES), names
    finally:
        migrate(None)
    assert index_definitions() == expected
    assert (APP, MIGRATION) in recorded()


def test_migration_0014_backwards_and_forwards_gives_the_same_indexes() -> None:
    """On every database: back to 0013 the old nw_due_idx (priority first) is back, no
    temporary index is left, and forwards again gives the model's indexes."""
    expected = index_definitions()
    try:
        migrate("0013_mysql_exact_text")
        back = index_definitions()
        assert "nw_due_idx_swap" not in back
        assert "'status'" not in back["nw_due_idx"].split("]")[0], back["nw_due_idx"]
    finally:
        migrate(None)
    assert index_definitions() == expected


@pytest.mark.postgresql
def test_an_interrupted_build_of_the_new_due_index_keeps_the_old_one_and_is_built_again() -> None:
    """0014's concurrent build is cancelled while it waits for an older snapshot: the old
    nw_due_idx is still there and valid (claims keep their index), the temporary index is
    left INVALID, and migrate again drops it, builds it, and swaps."""
    expected = index_definitions()
    migrate("0013_mysql_exact_text")
    holder, watcher = raw_connection(), raw_connection()
    failures: list[Exception] = []
    thread = None
    try:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM django_migrations")  # a snapshot the build waits out
        thread = migrate_in_thread(MIGRATION, failures)

        def building() -> Any:
            return watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND query ILIKE 'CREATE INDEX CONCURRENTLY%%nw_due_idx_swap%%' AND wait_event_type = 'Lock'"
            ).fetchone()

        (pid,) = wait_for(building, timeout=30, what="the concurrent build waiting")
        watcher.execute("SELECT pg_cancel_backend(%s)", [pid])
        thread.join(timeout=60)
        holder.execute("COMMIT")
        assert failures, "the cancelled build did not fail the migration"
        assert (validity("nw_due_idx"), validity("nw_due_idx_swap")) == (True, False)
        assert (APP, MIGRATION) not in recorded()
    finally:
        holder.close()
        watcher.close()
        if thread is not None:
            thread.join(timeout=60)
        migrate(None)
    assert (validity("nw_due_idx"), validity("nw_due_idx_swap")) == (True, None)
    assert index_definitions() == expected


@pytest.mark.postgresql
def test_an_invalid_new_due_index_left_by_the_earlier_0014_is_built_again() -> None:
    """The 0014 of the previous release dropped nw_due_idx first and then built the new one
    concurrently under the same name: interrupted, it left that index INVALID (unused by
    every claim). This 0014 finds the new shape under the final name and must not take it
    for a finished swap: it builds it again."""
    expected = index_definitions()
    migration = MigrationExecutor(connection).loader.get_migration(APP, MIGRATION)
    new_index = next(operation.index for operation in migration.operations if hasattr(operation, "index"))
    try:
        migrate("0013_mysql_exact_text")
        with connection.schema_editor() as editor:
            editor.execute("DROP INDEX nw_due_idx")
            editor.add_index(DeferredWork, new_index)
        with connection.cursor() as cursor:  # what an interrupted CREATE INDEX CONCURRENTLY leaves
            cursor.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'nw_due_idx'::regclass")
        assert validity("nw_due_idx") is False

        migrate(MIGRATION)

        assert (validity("nw_due_idx"), validity("nw_due_idx_swap")) == (True, None)
        assert (APP, MIGRATION) in recorded()
    finally:
        migrate(None)
    assert index_definitions() == expected

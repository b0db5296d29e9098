"""Helpers of the migration tests: migrate the app to a migration (in this thread or
another), what is recorded, the work table's indexes, an index's validity (PostgreSQL)."""

from __future__ import annotations

import threading
from typing import Any

from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor

from nexus_workflows.models import DeferredWork

APP = "nexus_workflows"
TABLE = DeferredWork._meta.db_table


def migrate(target: str | None) -> None:
    """The app to ``target`` (None: every app to its latest migration)."""
    executor = MigrationExecutor(connection)
    targets = [(APP, target)] if target else executor.loader.graph.leaf_nodes()
    executor.migrate(targets)


def recorded() -> set[tuple[str, str]]:
    return set(MigrationExecutor(connection).loader.applied_migrations)


def index_definitions() -> dict[str, str]:
    """The app's indexes and constraints on the work table, by name: columns, orders, kind."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, TABLE)
    return {
        name: repr((c["columns"], c.get("orders"), c["unique"], c["index"]))
        for name, c in constraints.items()
        if name.startswith("nw_")
    }


def migrate_in_thread(target: str | None, failures: list[Exception]) -> threading.Thread:
    """``migrate(target)`` in a thread of its own (its own connection); what it raises goes
    to ``failures``."""

    def run() -> None:
        try:
            migrate(target)
        except Exception as error:  # noqa: BLE001 - reported to the test
            failures.append(error)
        finally:
            connections["default"].close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def waiting_index_statements(watcher: Any) -> list[str]:
    """PostgreSQL: the CREATE/DROP INDEX statements waiting for a lock (``watcher``: a raw
    connection)."""
    rows = watcher.execute(
        "SELECT query FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND (query ILIKE 'CREATE INDEX%%' OR query ILIKE 'DROP INDEX%%')"
    ).fetchall()
    return [row[0] for row in rows]


def validity(name: str) -> bool | None:
    """PostgreSQL: whether the index ``name`` is valid; None when there is none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s",
            [name],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]

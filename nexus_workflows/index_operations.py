"""Migration operations that build and drop indexes without blocking writes on PostgreSQL.

``CREATE INDEX`` locks the table against writes (SHARE) for the whole build, about 0.4 s
per 500,000 rows; ``CONCURRENTLY`` (SHARE UPDATE EXCLUSIVE) lets enqueues, claims and
saves go on. Django's own ``AddIndexConcurrently`` runs on PostgreSQL only and the app
also runs on SQLite and MariaDB, so these run concurrently on PostgreSQL and as the
ordinary operation elsewhere; the migration state is the ordinary one, so the schema and
``makemigrations`` are the same as with ``AddIndex``/``RemoveIndex``.

A concurrent build cannot run in a transaction: migrations using these set
``atomic = False``, and put their other operations in :class:`InOneTransaction`. A
non-atomic migration is not rolled back when it fails, so each step here can be run again:
an interrupted concurrent build leaves an INVALID index, which the next run drops and
builds again; an index already built (valid) is kept; a drop of a missing index is a no-op;
a transaction group whose tables and columns are all there already is not run again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.db.migrations.operations import AddConstraint, AddIndex, RemoveIndex
from django.db.migrations.operations.base import Operation
from django.db.migrations.operations.fields import AddField
from django.db.migrations.operations.models import CreateModel
from django.db.migrations.state import ProjectState


def _concurrent(schema_editor: Any) -> bool:
    if schema_editor.connection.vendor != "postgresql":
        return False
    if schema_editor.connection.in_atomic_block:
        raise RuntimeError(
            "An index is built concurrently on PostgreSQL, which cannot be done in a "
            "transaction: the migration must set atomic = False."
        )
    return True


class AddIndexWithoutBlocking(AddIndex):
    """``AddIndex``; on PostgreSQL ``CREATE INDEX CONCURRENTLY``, re-runnable."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if not _concurrent(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            build_concurrently(schema_editor, model, self.index)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if not _concurrent(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            drop_concurrently(schema_editor, model, self.index.name)

    def describe(self) -> str:
        return super().describe() + " (concurrently on PostgreSQL)"


class RemoveIndexWithoutBlocking(RemoveIndex):
    """``RemoveIndex``; on PostgreSQL ``DROP INDEX CONCURRENTLY IF EXISTS``."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if not _concurrent(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            drop_concurrently(schema_editor, model, self.name)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if not _concurrent(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            build_concurrently(schema_editor, model, index)

    def describe(self) -> str:
        return super().describe() + " (concurrently on PostgreSQL)"


def build_concurrently(schema_editor: Any, model: Any, index: Any) -> None:
    def build() -> None:
        schema_editor.add_index(model, index, concurrently=True)

    build_once(schema_editor, model, index.name, build)


def build_once(schema_editor: Any, model: Any, name: str, build: Callable[[], None]) -> None:
    """``build`` the index ``name`` unless a valid one is there; an invalid one (an
    interrupted build's) is dropped first."""
    from nexus_workflows.sql import postgresql

    table = model._meta.db_table
    with schema_editor.connection.cursor() as cursor:
        valid = postgresql.index_validity(cursor, table, name)
    if valid:
        return  # built by an earlier run that stopped before recording the migration
    if valid is False:  # an interrupted build's leftover
        drop_concurrently(schema_editor, model, name)
    build()


def drop_concurrently(schema_editor: Any, model: Any, name: str) -> None:
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}")


class AddConstraintWithoutBlocking(AddConstraint):
    """``AddConstraint`` of a partial unique constraint (which Django builds as a unique
    index); on PostgreSQL ``CREATE UNIQUE INDEX CONCURRENTLY``, re-runnable."""

    constraint: Any  # set by AddConstraint (not in django-stubs' class)
    model_name: str

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if not _concurrent(schema_editor) or getattr(self.constraint, "condition", None) is None:
            super().database_forwards(app_label, schema_editor, from_state, to_state)
            return
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            statement = str(self.constraint.create_sql(model, schema_editor))
            if not statement.startswith("CREATE UNIQUE INDEX "):
                raise RuntimeError(f"constraint {self.constraint.name!r} is not built as an index")
            concurrent = statement.replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX CONCURRENTLY ", 1)
            build_once(schema_editor, model, self.constraint.name, lambda: schema_editor.execute(concurrent))

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if not _concurrent(schema_editor) or getattr(self.constraint, "condition", None) is None:
            super().database_backwards(app_label, schema_editor, from_state, to_state)
            return
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            drop_concurrently(schema_editor, model, self.constraint.name)

    def describe(self) -> str:
        return super().describe() + " (concurrently on PostgreSQL)"


class InOneTransaction(Operation):
    """Operations applied together in one transaction inside a non-atomic migration, as an
    atomic migration would apply them; skipped when a run that failed later (at an index
    build) had committed them already, which their tables and columns show. On databases
    whose DDL is not transactional (MariaDB) they run one by one, as there always."""

    reversible = True

    def __init__(self, operations: list[Operation]) -> None:
        self.operations = operations
        super().__init__()

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return (self.__class__.__qualname__, [self.operations], {})

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        for operation in self.operations:
            operation.state_forwards(app_label, state)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        states = self._states(app_label, from_state)
        if self._applied(app_label, schema_editor, states[-1]):
            return
        with self._transaction(schema_editor):
            for operation, before, after in zip(self.operations, states, states[1:], strict=False):
                operation.database_forwards(app_label, schema_editor, before, after)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        states = self._states(app_label, to_state)
        steps = list(zip(self.operations, states, states[1:], strict=False))
        with self._transaction(schema_editor):
            for operation, before, after in reversed(steps):
                operation.database_backwards(app_label, schema_editor, after, before)

    def _transaction(self, schema_editor: Any) -> Any:
        connection = schema_editor.connection
        if connection.features.can_rollback_ddl:
            return transaction.atomic(connection.alias)
        return contextlib.nullcontext()  # MariaDB: DDL commits at once, as it always did here

    def _states(self, app_label: str, state: ProjectState) -> list[ProjectState]:
        states = [state]
        for operation in self.operations:
            after = states[-1].clone()
            operation.state_forwards(app_label, after)
            states.append(after)
        return states

    def _applied(self, app_label: str, schema_editor: Any, state: ProjectState) -> bool:
        connection = schema_editor.connection
        if not connection.features.can_rollback_ddl:
            return False
        wanted: dict[str, set[str]] = {}  # table -> columns this group creates
        for operation in self.operations:
            if isinstance(operation, CreateModel):
                wanted.setdefault(state.apps.get_model(app_label, operation.name)._meta.db_table, set())
            elif isinstance(operation, AddField):
                meta = state.apps.get_model(app_label, operation.model_name)._meta
                wanted.setdefault(meta.db_table, set()).add(meta.get_field(operation.name).column)
        if not wanted:
            return False
        with connection.cursor() as cursor:
            tables = set(connection.introspection.table_names(cursor))
            for table, columns in wanted.items():
                if table not in tables:
                    return False
                present = {c.name for c in connection.introspection.get_table_description(cursor, table)}
                if not columns <= present:
                    return False
        return True

    def describe(self) -> str:
        return "In one transaction: " + "; ".join(operation.describe() for operation in self.operations)

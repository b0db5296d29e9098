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

An index that queries need at every moment (the claims' ``nw_due_idx``) is replaced with
:class:`ReplaceIndexWithoutBlocking`: the new one is built before the old one is dropped.
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


class _WithoutBlocking:
    """What the operations below share: on PostgreSQL (when :meth:`_concurrently`) their
    concurrent step, given the model of the state in which the index exists; elsewhere the
    ordinary operation (the next class in the MRO: ``AddIndex``, ``RemoveIndex``...)."""

    model_name: str
    #: Whether the index exists after the operation (an add) or before it (a remove).
    index_after = True

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if not self._concurrently(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)  # type: ignore[misc]
            return
        state = to_state if self.index_after else from_state
        model = self._model(app_label, schema_editor, state)
        if model is not None:
            self._forwards_concurrently(schema_editor, model, state)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if not self._concurrently(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)  # type: ignore[misc]
            return
        state = from_state if self.index_after else to_state  # backwards, from_state is the later
        model = self._model(app_label, schema_editor, state)
        if model is not None:
            self._backwards_concurrently(schema_editor, model, state)

    def _concurrently(self, schema_editor: Any) -> bool:
        return _concurrent(schema_editor)

    def _model(self, app_label: str, schema_editor: Any, state: ProjectState) -> Any:
        model = state.apps.get_model(app_label, self.model_name)
        allowed = self.allow_migrate_model(schema_editor.connection.alias, model)  # type: ignore[attr-defined]
        return model if allowed else None

    def _forwards_concurrently(self, schema_editor: Any, model: Any, state: ProjectState) -> None:
        raise NotImplementedError

    def _backwards_concurrently(self, schema_editor: Any, model: Any, state: ProjectState) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return super().describe() + " (concurrently on PostgreSQL)"  # type: ignore[misc]


class AddIndexWithoutBlocking(_WithoutBlocking, AddIndex):
    """``AddIndex``; on PostgreSQL ``CREATE INDEX CONCURRENTLY``, re-runnable."""

    def _forwards_concurrently(self, schema_editor: Any, model: Any, state: ProjectState) -> None:
        build_concurrently(schema_editor, model, self.index)

    def _backwards_concurrently(self, schema_editor: Any, model: Any, state: ProjectState) -> None:
        drop_concurrently(schema_editor, model, self.index.name)


class RemoveIndexWithoutBlocking(_WithoutBlocking, RemoveIndex):
    """``RemoveIndex``; on PostgreSQL ``DROP INDEX CONCURRENTLY IF EXISTS``."""

    index_after = False

    def _forwards_concurrently(self, schema_editor: Any, model: Any, state: ProjectState) -> None:
        drop_concurrently(schema_editor, model, self.name)

    def _backwards_concurrently(self, schema_editor: Any, model: Any, state: ProjectState) -> None:
        index = state.models[model._meta.app_label, self.model_name_lower].get_index_by_name(self.name)
        build_concurrently(schema_editor, model, index)


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


class AddConstraintWithoutBlocking(_WithoutBlocking, AddConstraint):
    """``AddConstraint`` of a partial unique constraint (which Django builds as a unique
    index); on PostgreSQL ``CREATE UNIQUE INDEX CONCURRENTLY``, re-runnable."""

    constraint: Any  # set by AddConstraint (not in django-stubs' class)

    def _concurrently(self, schema_editor: Any) -> bool:
        return _concurrent(schema_editor) and getattr(self.constraint, "condition", None) is not None

    def _forwards_concurrently(self, schema_editor: Any, model: Any, state: ProjectState) -> None:
        statement = str(self.constraint.create_sql(model, schema_editor))
        if not statement.startswith("CREATE UNIQUE INDEX "):
            raise RuntimeError(f"constraint {self.constraint.name!r} is not built as an index")
        concurrent = statement.replace("CREATE UNIQUE INDEX ", "CREATE UNIQUE INDEX CONCURRENTLY ", 1)
        build_once(schema_editor, model, self.constraint.name, lambda: schema_editor.execute(concurrent))

    def _backwards_concurrently(self, schema_editor: Any, model: Any, state: ProjectState) -> None:
        drop_concurrently(schema_editor, model, self.constraint.name)


class ReplaceIndexWithoutBlocking(Operation):
    """``RemoveIndex(old_name)`` then ``AddIndex(index)`` in the migration state (so the
    same schema and ``makemigrations``), for an index that queries need at every moment: the
    new index is built first under a temporary name (concurrently on PostgreSQL), then the
    old one dropped (concurrently) and the new one renamed (``ALTER INDEX … RENAME``: a
    SHARE UPDATE EXCLUSIVE lock, which writers do not wait for). Each step is skipped when a
    run stopped after it had done it, which the indexes on the table show. On a database
    that cannot rename an index (SQLite) the ordinary drop and build."""

    reversible = True

    def __init__(self, model_name: str, old_name: str, index: Any) -> None:
        self.model_name = model_name
        self.old_name = old_name
        self.index = index
        super().__init__()

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs = {"model_name": self.model_name, "old_name": self.old_name, "index": self.index}
        return (self.__class__.__qualname__, [], kwargs)

    def _operations(self) -> tuple[RemoveIndex, AddIndex]:
        return RemoveIndex(self.model_name, self.old_name), AddIndex(self.model_name, self.index)

    def state_forwards(self, app_label: str, state: ProjectState) -> None:
        for operation in self._operations():
            operation.state_forwards(app_label, state)

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        old = from_state.models[app_label, self.model_name.lower()].get_index_by_name(self.old_name)
        self._replace(app_label, schema_editor, to_state, old, self.index)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        old = to_state.models[app_label, self.model_name.lower()].get_index_by_name(self.old_name)
        self._replace(app_label, schema_editor, to_state, self.index, old)

    def _replace(self, app_label: str, schema_editor: Any, state: ProjectState, old: Any, new: Any) -> None:
        model = state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return
        if not schema_editor.connection.features.can_rename_index:
            with transaction.atomic(schema_editor.connection.alias):  # SQLite: all or nothing
                schema_editor.remove_index(model, old)
                schema_editor.add_index(model, new)
            return
        swap = IndexSwap(schema_editor, model, old, new)
        for step in swap.steps():
            step()

    def describe(self) -> str:
        return f"Replace index {self.old_name} on {self.model_name} by {self.index.name}, built first"

    @property
    def migration_name_fragment(self) -> str:
        return f"replace_{self.model_name.lower()}_{self.index.name.lower()}"


class IndexSwap:
    """The steps of :class:`ReplaceIndexWithoutBlocking` on a database that renames indexes
    (PostgreSQL, MariaDB), each a no-op when an earlier run did it."""

    def __init__(self, schema_editor: Any, model: Any, old: Any, new: Any) -> None:
        self.schema_editor = schema_editor
        self.model = model
        self.old = old
        self.new = new
        self.temporary = new.clone()
        self.temporary.name = f"{new.name}_swap"

    def steps(self) -> list[Callable[[], None]]:
        return [self.build_temporary, self.drop_old, self.rename_temporary]

    def _shapes(self) -> dict[str, tuple[list[str], list[str]]]:
        """The columns and their orders of each index on the table, by name."""
        connection = self.schema_editor.connection
        with connection.cursor() as cursor:
            found = connection.introspection.get_constraints(cursor, self.model._meta.db_table)
        return {name: (c["columns"], c.get("orders") or []) for name, c in found.items() if c["index"]}

    def _shape(self, index: Any) -> tuple[list[str], list[str]]:
        meta = self.model._meta
        columns = [meta.get_field(field).column for field, _ in index.fields_orders]
        return columns, ["DESC" if order else "ASC" for _, order in index.fields_orders]

    def _done(self, shapes: dict[str, tuple[list[str], list[str]]]) -> bool:
        """Renamed already: the new name has the new index's shape (told from the old's)."""
        if self.temporary.name in shapes or self._shape(self.old) == self._shape(self.new):
            return False
        return shapes.get(self.new.name) == self._shape(self.new)

    def build_temporary(self) -> None:
        shapes = self._shapes()
        if self._done(shapes):
            if _concurrent(self.schema_editor):
                # The 0014 of an earlier release dropped the old index first: its build, if
                # interrupted, left the new shape INVALID under the final name. Built again
                # here; a valid one is kept.
                build_concurrently(self.schema_editor, self.model, self.new)
            return
        if self.temporary.name in shapes and shapes[self.temporary.name] != self._shape(self.new):
            self._drop(self.temporary.name)  # a reverse run's leftover: another index
            shapes = self._shapes()
        if _concurrent(self.schema_editor):
            build_concurrently(self.schema_editor, self.model, self.temporary)
        elif self.temporary.name not in shapes:
            self.schema_editor.add_index(self.model, self.temporary)

    def drop_old(self) -> None:
        shapes = self._shapes()
        if self.temporary.name in shapes and self.old.name in shapes:
            self._drop(self.old.name)

    def rename_temporary(self) -> None:
        shapes = self._shapes()
        if self.temporary.name in shapes and self.new.name not in shapes:
            self.schema_editor.rename_index(self.model, self.temporary, self.new)

    def _drop(self, name: str) -> None:
        if _concurrent(self.schema_editor):
            drop_concurrently(self.schema_editor, self.model, name)
        else:
            self.schema_editor.execute(self.schema_editor._delete_index_sql(self.model, name))


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

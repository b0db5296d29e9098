"""``UPDATE … RETURNING``: the claim and the done-write learn which rows they wrote in
the same statement (PostgreSQL, and SQLite from 3.35).

Which Django internals remain, and why: Django has no public API that returns rows from
``QuerySet.update()`` (5.2 and 6.1 alike). Django 6.1 returns them from the private
``QuerySet._update(values, returning_fields=...)`` (its own model saving uses it, with
the ``can_return_rows_from_update`` feature and the ORM's converters): used where it
exists. On Django 5.2 the ``UPDATE`` is compiled by ``sql.UpdateQuery`` (public enough to
be imported, not documented) and ``RETURNING`` is appended as text, with the converters
the ORM would apply. Either way the ORM compiles the ``WHERE`` clause, so the compare-and-
set conditions stay defined once, in querysets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from django.db import connections, transaction
from django.db.models import QuerySet
from django.db.models.sql import UpdateQuery


def can_return_from_update(using: str) -> bool:
    """Whether ``update_returning`` works on this database."""
    connection = connections[using]
    # can_return_rows_from_update is Django 6's flag; on 5.2, SQLite learnt RETURNING for
    # INSERT and UPDATE alike (3.35), so the INSERT flag says the same.
    flag = getattr(connection.features, "can_return_rows_from_update", None)
    if flag is None:
        flag = connection.features.can_return_columns_from_insert
    return connection.vendor in ("postgresql", "sqlite") and bool(flag)


def update_returning(
    queryset: QuerySet[Any], changes: dict[str, Any], names: Sequence[str]
) -> list[dict[str, Any]]:
    """``queryset.update(**changes)`` that returns each updated row's ``names`` (the first
    is always ``"pk"``) as a dict, values converted as the ORM reads them."""
    model = queryset.model
    fields = [model._meta.pk if name == "pk" else model._meta.get_field(name) for name in names]
    with transaction.mark_for_rollback_on_error(queryset.db):
        if hasattr(queryset, "_update") and _django_returns_rows(queryset.db):
            values = [(model._meta.get_field(name), None, value) for name, value in changes.items()]
            rows = queryset._update(values, returning_fields=fields)
        else:
            rows = _update_appending_returning(queryset, changes, fields)
    return [dict(zip(names, row, strict=True)) for row in rows]


def _django_returns_rows(using: str) -> bool:
    return bool(getattr(connections[using].features, "can_return_rows_from_update", False))


def _update_appending_returning(
    queryset: QuerySet[Any], changes: dict[str, Any], fields: list[Any]
) -> list[Any]:
    """Django 5.2: the ORM's ``UPDATE`` with ``RETURNING`` appended, converted by hand."""
    using = queryset.db
    connection = connections[using]
    query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))  # the stubs return Query
    query.add_update_values(changes)
    sql, params = query.get_compiler(using).as_sql()
    quote = connection.ops.quote_name
    sql = f"{sql} RETURNING {', '.join(quote(field.column) for field in fields)}"
    table = queryset.model._meta.db_table
    columns = [field.get_col(table) for field in fields]
    converters = [
        [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)] for col in columns
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned = cursor.fetchall()
    rows = []
    for raw in returned:
        row = []
        for col, convert, value in zip(columns, converters, raw, strict=True):
            for converter in convert:
                value = converter(value, col, connection)
            row.append(value)
        rows.append(row)
    return rows


def insert_returning_pk(
    model: type[Any], fields: Sequence[Any], using: str, also_returning: Sequence[Any] = ()
) -> tuple[str, tuple[Any, ...]]:
    """A one-row ``INSERT`` of ``fields`` that returns the new row's id (then the fields
    ``also_returning``), compiled once: ``(sql, trailing params)``; the caller appends the
    values in ``fields``' order and then the trailing params.

    Internals, and why: Django compiles an ``INSERT`` only for model instances
    (``QuerySet.create`` builds an instance and prepares every field on every call, which
    costs more than the round trip on the enqueue path). Compiling ``sql.InsertQuery``
    once with ``returning_fields`` set on its compiler gives the very statement
    ``create()`` sends, for the values to be bound per call.
    """
    from django.db.models.sql import InsertQuery

    query = InsertQuery(model)
    query.insert_values(list(fields), [model(trigger={})])
    compiler = query.get_compiler(using=using)
    compiler.returning_fields = [model._meta.pk, *also_returning]
    ((sql, _),) = compiler.as_sql()
    return sql, tuple(compiler.returning_params)


class PrecompiledUpdate:
    """``update_returning`` compiled once, for a hot path that runs the same statement with
    a few values changed (the wake-up's claim by id): ``run(values)`` binds ``values`` in
    the places of ``slots`` and converts what comes back as the ORM would.

    The ORM still builds the statement (``WHERE`` from the queryset, ``SET`` from
    ``changes``), so the compare-and-set conditions stay defined once, in querysets; only
    the compiling is skipped on later calls. ``slots`` are placeholder values given among
    ``changes`` and the queryset's filters, each of which must appear exactly once among
    the compiled parameters (a ``ValueError`` says so otherwise). Works where
    :func:`can_return_from_update` holds.
    """

    def __init__(
        self,
        queryset: QuerySet[Any],
        changes: dict[str, Any],
        names: Sequence[str],
        slots: Sequence[Any],
    ) -> None:
        self.using = queryset.db
        connection = connections[self.using]
        model = queryset.model
        fields = [model._meta.pk if name == "pk" else model._meta.get_field(name) for name in names]
        query = cast(UpdateQuery, queryset.query.chain(UpdateQuery))  # the stubs return Query
        query.add_update_values(changes)
        sql, params = query.get_compiler(self.using).as_sql()
        quote = connection.ops.quote_name
        returned = [quote(field.column) for field in fields]
        self.sql = f"{sql} RETURNING {', '.join(returned)}"
        self.params = list(params)
        self.positions = []
        for slot in slots:
            found = [index for index, param in enumerate(self.params) if param == slot]
            if len(found) != 1:
                raise ValueError(f"a slot appears {len(found)} times among the compiled parameters")
            self.positions.append(found[0])
        self.names = tuple(names)
        table = model._meta.db_table
        self.columns = [field.get_col(table) for field in fields]
        self.converters = [
            [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)]
            for col in self.columns
        ]

    def run(self, values: Sequence[Any]) -> list[dict[str, Any]]:
        """Run the statement with ``values`` in the slots' places (in their order)."""
        params = list(self.params)
        for position, value in zip(self.positions, values, strict=True):
            params[position] = value
        connection = connections[self.using]
        with transaction.mark_for_rollback_on_error(self.using), connection.cursor() as cursor:
            cursor.execute(self.sql, params)
            returned = cursor.fetchall()
        rows = []
        for raw in returned:
            row = {}
            # Not strict: an asynchronous commit's set_config() ends the row, unread.
            for name, col, convert, value in zip(
                self.names, self.columns, self.converters, raw, strict=False
            ):
                for converter in convert:
                    value = converter(value, col, connection)
                row[name] = value
            rows.append(row)
        return rows

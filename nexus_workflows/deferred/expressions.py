"""Two JSON-array updates done inside one ``UPDATE``, so a batch claim needs no read first.

Django has no portable expression for "append to a JSON array column", so each backend gets
its own SQL: PostgreSQL's ``jsonb`` operators, SQLite's JSON1 functions (3.31+ for
``$[#]``), MySQL's and MariaDB's ``JSON_ARRAY_APPEND``. Any other backend is refused with a
clear error rather than given a wrong result.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import NotSupportedError
from django.db.models import F, Func, JSONField


class _ArrayUpdate(Func):
    output_field = JSONField()

    def __init__(self, column: str | Any, *extra: Any) -> None:
        # A column name, or an expression (another update of the same column).
        super().__init__(F(column) if isinstance(column, str) else column)
        self.extra_params = extra

    def _column(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        sql, params = compiler.compile(self.source_expressions[0])
        return sql, list(params)

    def _refuse(self, connection: Any) -> NotSupportedError:
        return NotSupportedError(
            f"{type(self).__name__} supports PostgreSQL, SQLite and MySQL/MariaDB; "
            f"this database is {connection.vendor}"
        )


class JSONAppend(_ArrayUpdate):
    """``column`` (a JSON array) with ``value`` appended."""

    def __init__(self, column: str | Any, value: Any) -> None:
        super().__init__(column, json.dumps(value))

    # Narrower than Func.as_sql (no function, template, arg_joiner): the SQL is fixed, and
    # Django's compiler calls as_sql(compiler, connection).
    def as_sql(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> tuple[str, list[Any]]:
        column, params = self._column(compiler, connection)
        if connection.vendor == "postgresql":
            sql = f"(COALESCE({column}, '[]'::jsonb) || jsonb_build_array(CAST(%s AS jsonb)))"
        elif connection.vendor == "sqlite":
            sql = f"json_insert(COALESCE({column}, '[]'), '$[#]', json(%s))"
        elif connection.vendor == "mysql":
            sql = f"JSON_ARRAY_APPEND(COALESCE({column}, JSON_ARRAY()), '$', JSON_EXTRACT(%s, '$'))"
        else:
            raise self._refuse(connection)
        return sql, [*params, *self.extra_params]


class JSONDropLast(_ArrayUpdate):
    """``column`` (a JSON array) without its last element."""

    # Narrower than Func.as_sql (no function, template, arg_joiner): the SQL is fixed, and
    # Django's compiler calls as_sql(compiler, connection).
    def as_sql(  # type: ignore[override]
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> tuple[str, list[Any]]:
        column, params = self._column(compiler, connection)
        if connection.vendor == "postgresql":
            sql = f"(COALESCE({column}, '[]'::jsonb) - -1)"
        elif connection.vendor == "sqlite":
            sql = f"json_remove(COALESCE({column}, '[]'), '$[#-1]')"
        elif connection.vendor == "mysql":
            sql = (
                f"IF(JSON_LENGTH({column}) > 0, "
                f"JSON_REMOVE({column}, CONCAT('$[', JSON_LENGTH({column}) - 1, ']')), {column})"
            )
            params = params * 4
        else:
            raise self._refuse(connection)
        return sql, params

"""SQLite's statements beyond the portable ORM: ``UPDATE … RETURNING`` and the precompiled
``INSERT`` (SQLite ≥ 3.35, :mod:`.returning`), and reading which unique constraint an
``IntegrityError`` is about (SQLite names the columns, not the constraint).

SQLite has no ``NOTIFY`` (runners poll, and in-process runners are woken directly), no
``jsonb`` bulk insert and no data-modifying CTE: those callers take the ORM path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

from django.apps import apps
from django.db import IntegrityError, connections, transaction
from django.db.models import Field, QuerySet

# The claims' reads of due rows are the ORM's here (nw_due_idx): the portable answers.
from nexus_workflows.sql.portable import due_ids, due_in_order
from nexus_workflows.sql.returning import can_return_from_update, insert_returning_pk, update_returning

__all__ = [
    "EPOCH_OF_MINUTE",
    "add_outcome_counts",
    "can_return_from_update",
    "claimable",
    "constraint_name",
    "due_ids",
    "due_in_order",
    "insert_returning_pk",
    "lock_waits_at_most",
    "notify",
    "statement_timeout",
    "update_returning",
    "values_sent_apart",
    "violated_constraint",
]

_UNIQUE = re.compile(r"UNIQUE constraint failed: (?P<columns>[\w.]+(?:, [\w.]+)*)")


def violated_constraint(error: IntegrityError) -> str | None:
    """The name of the app's unique constraint whose columns SQLite's message names
    (``UNIQUE constraint failed: table.a, table.b``), or None."""
    found = _UNIQUE.search(str(error))
    if found is None:
        return None
    failed = set(found["columns"].split(", "))
    for model in apps.get_app_config("nexus_workflows").get_models():
        table = model._meta.db_table
        for constraint in model._meta.constraints:
            fields = getattr(constraint, "fields", ())
            # A unique constraint's fields are columns, never relations' reverse sides.
            named = [cast("Field[Any, Any]", model._meta.get_field(name)) for name in fields]
            columns = {f"{table}.{field.column}" for field in named}
            if columns and columns == failed:
                return constraint.name
    return None


def of_ids(queryset: QuerySet[Any], ids: Sequence[Any]) -> QuerySet[Any]:
    """The rows ``ids`` of ``queryset``."""
    return queryset.filter(pk__in=ids)


def claimable(candidates: QuerySet[Any], ids: Sequence[Any]) -> QuerySet[Any]:
    """The rows ``ids`` of ``candidates``, as they are: SQLite has no row locks, only
    one writer at a time, which a claim waits for (up to the connection's ``timeout``)."""
    return candidates.filter(pk__in=ids)


def constraint_name(error: Exception) -> None:
    """Not read (None): for an unnamed CHECK, SQLite's message quotes its expression, which
    may hold values."""
    return None


def lock_waits_at_most(using: str, seconds: float) -> AbstractContextManager[None]:
    """As it is (None): SQLite has no row locks, only the database's write lock, which its
    ``busy_timeout`` (Django's ``timeout`` option) already bounds."""
    return nullcontext()


def values_sent_apart(using: str) -> AbstractContextManager[None]:
    """As it is: SQLite keeps no log of statements."""
    return nullcontext()


def notify(cursor: object, channel: str, payload: str = "") -> None:
    """No ``NOTIFY`` on SQLite: nothing to send (in-process runners are woken directly)."""


def statement_timeout(using: str) -> None:
    """SQLite has no ``statement_timeout`` (and never cancels a statement by time): None,
    unknown, as on other databases."""
    return None


def add_outcome_counts(using: str, token: str, items: Sequence[tuple[str, str, int]]) -> bool:
    """Add ``(kind, outcome, n)`` counts to the database clock's current minute, once per
    ``token``: the token's row (``INSERT OR IGNORE``) and, only if it was new, the counts
    (``ON CONFLICT DO UPDATE`` adds to the minute's rows), in one transaction. Returns
    whether they were added."""
    from nexus_workflows.observability.models import OutcomeCount, OutcomeFlush

    connection = connections[using]
    table = connection.ops.quote_name(OutcomeCount._meta.db_table)
    flushes = connection.ops.quote_name(OutcomeFlush._meta.db_table)
    minute = "strftime('%%Y-%%m-%%d %%H:%%M:00', 'now')"
    values = ", ".join(f"({minute}, %s, %s, %s)" for _ in items)
    add = f"ON CONFLICT (minute, kind, outcome) DO UPDATE SET count = {table}.count + excluded.count"
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT OR IGNORE INTO {flushes} (token, at) "
            "VALUES (%s, strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now'))",
            [token],
        )
        if cursor.rowcount != 1:
            return False
        cursor.execute(
            f"INSERT INTO {table} (minute, kind, outcome, count) VALUES {values} {add}",
            [value for item in items for value in item],
        )
    return True


#: A minute column as seconds since the epoch (the dashboard's 5-minute buckets).
EPOCH_OF_MINUTE = "CAST(strftime('%%s', minute) AS INTEGER)"

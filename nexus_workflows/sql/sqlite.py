"""SQLite's statements beyond the portable ORM: ``UPDATE … RETURNING`` and the precompiled
``INSERT`` (SQLite ≥ 3.35, :mod:`.returning`), and reading which unique constraint an
``IntegrityError`` is about (SQLite names the columns, not the constraint).

SQLite has no ``NOTIFY`` (runners poll, and in-process runners are woken directly), no
``jsonb`` bulk insert and no data-modifying CTE: those callers take the ORM path.
"""

from __future__ import annotations

import re

from django.apps import apps
from django.db import IntegrityError

from .returning import can_return_from_update, insert_returning_pk, update_returning

__all__ = [
    "can_return_from_update",
    "insert_returning_pk",
    "notify",
    "update_returning",
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
            columns = {f"{table}.{model._meta.get_field(name).column}" for name in fields}
            if columns and columns == failed:
                return constraint.name
    return None


def notify(cursor: object, channel: str, payload: str = "") -> None:
    """No ``NOTIFY`` on SQLite: nothing to send (in-process runners are woken directly)."""

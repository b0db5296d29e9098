"""Every statement beyond the portable ORM, in one place.

- :mod:`.returning`: ``UPDATE … RETURNING`` and the precompiled one-row ``INSERT …
  RETURNING`` (PostgreSQL and SQLite ≥ 3.35 alike).
- :mod:`.postgresql`: the ``jsonb`` bulk insert, the journal writer's batch of saves, the
  PHI token allocation CTE, LISTEN and NOTIFY, the outcome counts' once-per-token upsert,
  a minute as epoch seconds, the session's ``statement_timeout``, and reading a unique
  violation's constraint name.
- :mod:`.sqlite`: the outcome counts' upsert, a minute as epoch seconds, and reading a
  unique violation's constraint from SQLite's message.
- :mod:`.portable`: what every other backend does instead, through the plain ORM.

Two kinds of backend-specific SQL stay where Django expects them, as expressions the ORM
composes into its own statements: the JSON-array updates of
:mod:`nexus_workflows.deferred.expressions` and the database clock of :mod:`nexus_workflows.clock`.

``for_connection(using)`` picks the module for a connection; callers ask it and never
test ``connection.vendor`` themselves. Each statement has a test that runs it
(``tests/test_sql.py``), on Django 5.2 and 6.1 alike.
"""

from __future__ import annotations

from types import ModuleType

from django.db import connections


def for_connection(using: str) -> ModuleType:
    """The statements module of the database ``using``: its backend's, or the portable one."""
    vendor = connections[using].vendor
    if vendor == "postgresql":
        from nexus_workflows.sql import postgresql

        return postgresql
    if vendor == "sqlite":
        from nexus_workflows.sql import sqlite

        return sqlite
    from nexus_workflows.sql import portable

    return portable


def refused_by(error: Exception) -> str:
    """What refused a row, for the app's own message: the constraint's name when the
    driver reports it, else the error's type. Never the driver's message, which quotes
    the row (a trigger, a task's arguments)."""
    diag = getattr(error.__cause__, "diag", None)
    name = getattr(diag, "constraint_name", None)
    return f"constraint {name!r}" if name else type(error).__name__

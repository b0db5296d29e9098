"""Every statement beyond the portable ORM, in one place.

- :mod:`.returning`: ``UPDATE … RETURNING`` and the precompiled one-row ``INSERT …
  RETURNING`` (PostgreSQL and SQLite ≥ 3.35 alike).
- :mod:`.postgresql`: the ``jsonb`` bulk insert, the journal writer's batch of saves, the
  PHI token allocation CTE, LISTEN and NOTIFY, the outcome counts' once-per-token upsert,
  a minute as epoch seconds, the session's ``statement_timeout``, a transaction whose lock
  waits are bounded (``lock_waits_at_most``: the runner's purge), a read-only snapshot
  (``read_only_snapshot``: an admin list's counts and rows), the writes of patient data
  with their values sent apart from the statement's text (``values_sent_apart``: kept out
  of the server's log of failed statements), and reading a unique violation's constraint
  name.
- :mod:`.sqlite`: the outcome counts' upsert, a minute as epoch seconds, and reading a
  unique violation's constraint from SQLite's message.
- :mod:`.mysql`: MySQL and MariaDB (tested on MariaDB): the outcome counts' upsert, a
  minute as epoch seconds, reading a refusal's constraint from the server's message,
  MariaDB's nesting limit of JSON documents, bounded lock waits (the runner's purge), and
  a read-only snapshot (an admin list's).
- :mod:`.portable`: what every other backend does instead, through the plain ORM.

Two kinds of backend-specific SQL stay where Django expects them, as expressions the ORM
composes into its own statements: the JSON-array updates of
:mod:`nexus_workflows.deferred.expressions` and the database clock of :mod:`nexus_workflows.clock`.

``for_connection(using)`` picks the module for a connection; callers ask it and never
test ``connection.vendor`` themselves. Each statement has a test that runs it
(``tests/test_sql.py``), on Django 5.2 and 6.1 alike.
"""

from __future__ import annotations

import functools
from types import ModuleType

from django.db import connections


def for_connection(using: str) -> ModuleType:
    """The statements module of the database ``using``: its backend's, or the portable one."""
    return _module_of(connections[using].vendor)


def _module_of(vendor: str) -> ModuleType:
    if vendor == "postgresql":
        from nexus_workflows.sql import postgresql

        return postgresql
    if vendor == "sqlite":
        from nexus_workflows.sql import sqlite

        return sqlite
    if vendor == "mysql":
        from nexus_workflows.sql import mysql

        return mysql
    from nexus_workflows.sql import portable

    return portable


def refused_by(error: Exception, using: str) -> str:
    """What refused a row on ``using``, for the app's own message: the constraint's name
    where the backend's module can read it (psycopg's diagnostics; MySQL/MariaDB's
    message), else the error's type. Never the driver's message, which quotes the row (a
    trigger, a task's arguments)."""
    name = for_connection(using).constraint_name(error)
    return f"constraint {name!r}" if name else type(error).__name__


def database_json_depth(using: str) -> int | None:
    """Most containers the database ``using`` accepts nested in one stored JSON document,
    where that is below the app's own limit (:data:`json_values.MAX_DEPTH`): MariaDB's
    (``mysql.JSON_DEPTH_LIMIT``). None elsewhere."""
    return _database_json_depth(connections[using].vendor)


def json_depth(using: str, *, nested_in: int = 0) -> int:
    """Most containers a value stored on ``using`` may nest (a trigger, a journal; with
    ``nested_in``, one that sits that many containers down in the stored document, as a
    task's arguments do): the app's limit, or less where the database's is lower. Deeper is
    refused before any write, with the app's error, instead of by the database's CHECK."""
    return _json_depth(connections[using].vendor, nested_in)


# Per vendor, once: every enqueue and save asks (a vendor's limit never changes).
@functools.cache
def _database_json_depth(vendor: str) -> int | None:
    limit: int | None = getattr(_module_of(vendor), "JSON_DEPTH_LIMIT", None)
    return limit


@functools.cache
def _json_depth(vendor: str, nested_in: int) -> int:
    from nexus_workflows.json_values import MAX_DEPTH

    database = _database_json_depth(vendor)
    return MAX_DEPTH if database is None else min(MAX_DEPTH, database - nested_in)

"""The database's clock: every time the app decides by comes from here, never from a host.

``DatabaseNow`` is Django's ``Now()`` except on SQLite, where Django's own ``Now()`` writes
``2026-12-03 09:38:46.047`` while a datetime parameter is written ``2026-12-03
09:38:46.047000`` (``str(datetime)``). SQLite compares those as text, so a row stamped by
``Now()`` would never equal the very value read back from it, and a compare-and-set on a
timestamp (the admin's revive) would never match. ``DatabaseNow`` writes what
``str(datetime)`` writes: six fractional digits, none when they are all zero.

On MySQL and MariaDB Django's ``Now()`` is ``CURRENT_TIMESTAMP(6)``, the time in the
session's time zone (the server's, ``SYSTEM``, unless set), while Django stores and reads
datetimes as UTC there: on a server whose zone is not UTC every time the database wrote
would be off by its offset. ``DatabaseNow`` is ``UTC_TIMESTAMP(6)`` there.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, Value
from django.db.models.functions import Now
from django.utils import timezone
from django.utils.dateparse import parse_datetime

_SQLITE_NOW = (
    "CASE WHEN STRFTIME('%%%%f', 'NOW') LIKE '%%%%.000' "
    "THEN STRFTIME('%%%%Y-%%%%m-%%%%d %%%%H:%%%%M:%%%%S', 'NOW') "
    "ELSE STRFTIME('%%%%Y-%%%%m-%%%%d %%%%H:%%%%M:%%%%f000', 'NOW') END"
)


class DatabaseNow(Now):
    """The database's current time, stored as Django stores a datetime parameter."""

    def as_sqlite(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        # 'NOW' is the same instant for every call within one statement step.
        return self.as_sql(compiler, connection, template=_SQLITE_NOW, **extra_context)

    def as_mysql(self, compiler: Any, connection: Any, **extra_context: Any) -> Any:
        return self.as_sql(compiler, connection, template="UTC_TIMESTAMP(6)", **extra_context)


def database_now(using: str) -> datetime:
    """The database's current time (aware, UTC), in one query: for a cut-off that must
    not move, or a figure computed outside a statement."""
    connection = connections[using]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT statement_timestamp()")
            value = cursor.fetchone()[0]
        elif connection.vendor == "sqlite":
            cursor.execute("SELECT STRFTIME('%Y-%m-%d %H:%M:%f', 'NOW')")
            value = parse_datetime(cursor.fetchone()[0])
        elif connection.vendor == "mysql":
            cursor.execute("SELECT UTC_TIMESTAMP(6)")  # naive, UTC: see DatabaseNow
            value = cursor.fetchone()[0]
        else:
            return timezone.now()
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


def due_after(delay: timedelta, *, now: datetime, using: str) -> Any:
    """When new work is due, for a statement the ORM writes: the database's now plus
    ``delay``, evaluated by the statement, never the enqueuing host's clock (hosts whose
    clocks disagree must agree on what is due). PostgreSQL's one-row and bulk inserts
    compute the same in their own SQL (``sql.postgresql.DUE_SQL``).

    SQLite's clock is this host's own (it runs in the process), so there ``now`` (the
    host's time of the enqueue) serves, truncated to the milliseconds that clock keeps: a
    row due at the host's microseconds would not be due, by the database's clock, until
    the next millisecond, and a claim in the same millisecond would miss it.
    """
    if connections[using].vendor == "sqlite":
        return now.replace(microsecond=now.microsecond // 1000 * 1000) + delay
    return now_plus(delay) if delay else DatabaseNow()


def now_plus(delta: timedelta) -> Any:
    """The database's current time plus ``delta``, as an expression."""
    later = DatabaseNow() + Value(delta, output_field=DurationField())
    return ExpressionWrapper(later, output_field=DateTimeField())

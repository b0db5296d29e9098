"""The database's clock, read where a time is needed outside a write."""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import connections
from django.utils import timezone


def database_now(using: str) -> datetime:
    """The database's current time (aware, UTC); the process's clock elsewhere."""
    connection = connections[using]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]
        if connection.vendor == "sqlite":
            # Django stores SQLite times as UTC text; 'now' is UTC too.
            cursor.execute("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')")
            value = datetime.fromisoformat(cursor.fetchone()[0])
            return value.replace(tzinfo=UTC)
    return timezone.now()

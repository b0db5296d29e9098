"""psycopg connections of the test database's own, outside Django's: for a LISTEN, or to
watch sessions and locks while the code under test uses Django's connections."""

from __future__ import annotations

from typing import Any

from django.db import connection


def raw_connection(**options: Any) -> Any:
    """An autocommit psycopg connection to the database ``connection`` points at, with
    Django's own connection parameters (``options`` override them)."""
    import psycopg

    params = dict(connection.get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    return psycopg.connect(**{**params, **options}, autocommit=True)

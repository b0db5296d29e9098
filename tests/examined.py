"""How many rows a statement's read examines, from the database's own execution of it
(``EXPLAIN ANALYZE``): PostgreSQL's and MariaDB's. The claims' tests use it to show a read
that stops at its limit, not one that walks past other rows first."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection


def rows_examined(sql: str) -> int:
    """Rows the table accesses of ``sql`` read when run again now (PostgreSQL or MariaDB)."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE FORMAT=JSON {sql}")
            return int(mariadb_rows_read(json.loads(cursor.fetchone()[0])))
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return postgresql_rows_read(plan[0]["Plan"])


def postgresql_rows_read(plan: Any) -> int:
    """Rows every scan of a PostgreSQL ``EXPLAIN (ANALYZE, FORMAT JSON)`` plan read: those it
    returned and those its filter removed, times its loops."""
    own = 0
    if "Scan" in plan["Node Type"]:
        read = plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
        own = int(read * plan.get("Actual Loops", 1))
    return own + sum(postgresql_rows_read(child) for child in plan.get("Plans", []))


def mariadb_rows_read(plan: Any) -> float:
    """Rows every access of a table (not of a derived one, ``<derived2>``) in a MariaDB
    ``ANALYZE FORMAT=JSON`` plan read: ``r_rows`` (per loop, before the attached
    condition) times ``r_loops``."""
    if isinstance(plan, list):
        return sum(mariadb_rows_read(item) for item in plan)
    if not isinstance(plan, dict):
        return 0
    own = 0.0
    if not str(plan.get("table_name", "<")).startswith("<") and "r_rows" in plan:
        # An access never made (r_loops 0: a subquery of no row) has r_rows null.
        own = float(plan["r_rows"] or 0) * float(plan.get("r_loops", 1))
    return own + sum(mariadb_rows_read(value) for value in plan.values())

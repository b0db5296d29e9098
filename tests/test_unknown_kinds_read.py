"""The read behind the admin's unknown-kinds notice (above every list page) and ``workflows
status``: due rows of a registered workflow's kind are never read, however many there are
(a backlog while runners are down): the kinds come from an index, one probe per kind (on
PostgreSQL those with pending rows), and only the due rows of the other kinds are read."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nexus_workflows.clock import DatabaseNow
from nexus_workflows.deferred.registry import Workflow
from nexus_workflows.deferred.unknown_kinds import due_of_unknown_kinds
from nexus_workflows.models import DeferredWork
from tests.admin.test_list_at_scale import COLUMNS, TABLE

pytestmark = pytest.mark.django_db(transaction=True)

BACKLOG = 3_000


def _noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    return None


def fill_due(kind: str, rows: int) -> None:
    """``rows`` pending rows of ``kind``, due an hour ago, in one statement, then analysed."""
    columns = ", ".join(connection.ops.quote_name(name.strip()) for name in COLUMNS.split(","))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} ({columns}) SELECT %s, 'due-' || g, '{{}}', '{{}}', 'pending', 0, "
            f"now() - interval '1 hour', '', '', '[]', now(), now(), 0, '', '', '[]', '[]', 0 "
            f"FROM generate_series(1, %s) g",
            [kind, rows],
        )
        cursor.execute(f"ANALYZE {TABLE}")


def rows_read(sql: str) -> int:
    """Rows the statement's scans returned, by ``EXPLAIN ANALYZE`` (each loop counted)."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan

    def scanned(node: dict[str, Any]) -> int:
        own = node["Actual Rows"] * node["Actual Loops"] if "Scan" in node["Node Type"] else 0
        return own + sum(scanned(child) for child in node.get("Plans", []))

    return scanned(plan[0]["Plan"])


@pytest.mark.postgresql
def test_a_backlog_of_registered_kinds_is_not_read(register_workflow: Callable[..., Workflow]) -> None:
    workflow = register_workflow(_noop, retry_schedule=[1])
    fill_due(workflow.kind, BACKLOG)
    past = timezone.now() - timedelta(minutes=5)
    for n in range(2):
        DeferredWork.objects.create(
            kind="reminders.removed", dedupe_key=f"r{n}", trigger={}, next_attempt_at=past
        )
    with CaptureQueriesContext(connection) as queries:
        found = due_of_unknown_kinds(DatabaseNow())
    assert found == {"reminders.removed": 2}
    statements = [q["sql"] for q in queries.captured_queries]
    read = sum(rows_read(sql) for sql in statements)
    assert read < 50, (read, statements)  # the 3,000 due rows of the registered kind: not read


@pytest.mark.postgresql
def test_only_registered_kinds_pending_costs_one_probe_per_kind(
    register_workflow: Callable[..., Workflow],
) -> None:
    workflow = register_workflow(_noop, retry_schedule=[1])
    fill_due(workflow.kind, BACKLOG)
    with CaptureQueriesContext(connection) as queries:
        assert due_of_unknown_kinds(DatabaseNow()) == {}
    assert len(queries.captured_queries) == 1
    assert rows_read(queries.captured_queries[0]["sql"]) < 10


def test_rows_of_registered_kinds_are_left_out_by_the_statement(
    register_workflow: Callable[..., Workflow],
) -> None:
    """Every database: the grouped read names the other kinds only (an index range each)."""
    workflow = register_workflow(_noop, retry_schedule=[1])
    past = timezone.now() - timedelta(minutes=5)
    for n in range(3):
        DeferredWork.objects.create(kind=workflow.kind, dedupe_key=f"k{n}", trigger={}, next_attempt_at=past)
    DeferredWork.objects.create(kind="reminders.removed", dedupe_key="r", trigger={}, next_attempt_at=past)
    with CaptureQueriesContext(connection) as queries:
        assert due_of_unknown_kinds(DatabaseNow()) == {"reminders.removed": 1}
    grouped = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(grouped) == 1
    (sql,) = grouped
    assert workflow.kind not in sql, sql
    assert "IN ('reminders.removed')" in sql, sql

"""The triage list with more done rows than are worth counting (counting.EXACT_UP_TO is
20,000): what needs action is counted exactly, done rows and the total are the
database's estimate ("about"), and no statement counts the whole table."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from nexus_workflows.models import DeferredWork, Status
from tests.admin.conftest import client_for

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:nexus_workflows_deferredwork_changelist"
DONE_ROWS = 25_000
TABLE = DeferredWork._meta.db_table
COLUMNS = (
    "kind, dedupe_key, trigger, checkpoints, status, attempt, next_attempt_at, claim_token, last_error, "
    "history, created_at, updated_at, lost_unstarted, backend_name, queue_name, errors, worker_ids, priority"
)


def fill_done(kind: str, rows: int) -> None:
    """``rows`` done rows of ``kind`` in one statement, then the table's statistics."""
    columns = ", ".join(connection.ops.quote_name(name.strip()) for name in COLUMNS.split(","))
    values = (
        "%s, {key}, '{{}}', '{{}}', 'done', 0, {now}, '', '', '[]', {now}, {now}, 0, '', '', '[]', '[]', 0"
    )
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            select = values.format(key="'done-' || g", now="now()")
            cursor.execute(
                f"INSERT INTO {TABLE} ({columns}) SELECT {select} FROM generate_series(1, %s) g", [kind, rows]
            )
            cursor.execute(f"ANALYZE {TABLE}")
        elif connection.vendor == "mysql":
            select = values.format(key="CONCAT('done-', seq)", now="UTC_TIMESTAMP(6)")
            cursor.execute(f"INSERT INTO {TABLE} ({columns}) SELECT {select} FROM seq_1_to_{rows}", [kind])
            cursor.execute(f"ANALYZE TABLE {TABLE}")
            cursor.fetchall()
        else:
            select = values.format(key="'done-' || n", now="strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')")
            cursor.execute(
                f"WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < %s) "
                f"INSERT INTO {TABLE} ({columns}) SELECT {select} FROM seq",
                [rows, kind],
            )


def estimates() -> bool:
    return connection.vendor in ("postgresql", "mysql")


def test_action_counts_are_exact_and_done_rows_estimated_without_counting_the_table(
    superuser: Any, make_work: Any, workflow: Any
) -> None:
    fill_done(workflow.kind, DONE_ROWS)
    for _ in range(3):
        make_work(Status.ABANDONED)
    for _ in range(2):
        make_work(Status.PROCESSING, heartbeat_at=timezone.now() - timedelta(hours=1))
    make_work(Status.PROCESSING)
    for _ in range(4):
        make_work(Status.PENDING)
    with CaptureQueriesContext(connection) as queries:
        response = client_for(superuser).get(reverse(CHANGELIST))
    assert response.status_code == 200
    summary = {item.value: item for item in response.context["cl"].status_summary}
    exact = {
        value: summary[value].count for value in ("attention", "abandoned", "stale", "pending", "processing")
    }
    assert exact == {"attention": 5, "abandoned": 3, "stale": 2, "pending": 4, "processing": 3}
    assert not any(summary[value].estimated for value in exact)
    html = response.content.decode()
    done = summary["done"]
    if estimates():
        assert done.estimated
        assert summary[None].estimated
        assert abs(done.count - DONE_ROWS) <= DONE_ROWS // 10, done.count
        assert re.search(r"about</abbr> \d+</span>\s*<span class=\"nw-summary-label\">Done", html)
        assert re.search(r'<span class="nw-estimated">about</span> \d+ deferred work', html)
        counted = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
        assert counted
        for sql in counted:  # what needs action, each through its index; never all, never done
            assert " WHERE " in sql, sql
            assert "'done'" not in sql, sql
    else:  # SQLite: no estimates; counted
        assert (done.count, done.estimated) == (DONE_ROWS, False)
        assert "about" not in html
        assert f"{DONE_ROWS + 10} deferred work" in html


def test_slices_that_need_action_are_counted_exactly_by_the_paginator(
    superuser: Any, make_work: Any, workflow: Any
) -> None:
    fill_done(workflow.kind, DONE_ROWS)
    for _ in range(3):
        make_work(Status.ABANDONED)
    html = client_for(superuser).get(reverse(CHANGELIST) + "?status=attention").content.decode()
    assert re.search(r'<p class="paginator">\s*3 deferred work', html), html[
        html.find('class="paginator"') :
    ][:200]
    assert "nw-estimated" not in html


def test_the_kind_filter_lists_registered_and_stored_kinds(
    superuser: Any, make_work: Any, workflow: Any
) -> None:
    """Every stored kind (a removed one with done rows only included) and every registered
    one, read from the dedupe constraint's index on PostgreSQL, not by a DISTINCT over the
    table."""
    make_work(Status.DONE, kind="retired-kind")
    make_work(Status.ABANDONED, kind="another-kind")
    with CaptureQueriesContext(connection) as queries:
        response = client_for(superuser).get(reverse(CHANGELIST))
    choices = next(
        spec for spec in response.context["cl"].filter_specs if getattr(spec, "lookup_kwarg", None) == "kind"
    )
    listed = set(choices.lookup_choices)
    assert {"retired-kind", "another-kind", workflow.kind} <= listed
    if connection.vendor == "postgresql":
        assert not [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT DISTINCT")]


def test_a_list_that_matches_nothing_by_construction_is_counted_without_a_query(superuser: Any) -> None:
    """A ``?q=`` (never searched: see finding.py) and the unknown-kind filter with no such
    kind make querysets with no SQL: the estimate is skipped, the page shows 0."""
    client = client_for(superuser)
    for query in ({"q": "anything"}, {"status": "unknown"}):
        response = client.get(reverse(CHANGELIST), query)
        assert response.status_code == 200
        assert response.context["cl"].result_count == 0

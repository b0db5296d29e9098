"""The triage list's counts agree with each other and with the rows shown while a runner
drains: a row that moves from pending to processing between two of the page's reads is
counted once, in one of them (one snapshot on PostgreSQL and MariaDB, one statement on
SQLite), never in both."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse

from nexus_workflows.models import DeferredWork, Status
from tests.admin.conftest import client_for
from tests.admin.test_list_at_scale import fill_done

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:nexus_workflows_deferredwork_changelist"
SNAPSHOTS = [
    pytest.param("postgresql", marks=pytest.mark.postgresql),
    pytest.param("mariadb", marks=pytest.mark.mysql),
]


def claimed_after_the_first_count(pk: int) -> Any:
    """An execute wrapper: once the page's first count has run, a runner on another
    connection claims row ``pk`` (pending to processing) and commits."""
    done: list[bool] = []

    def claim() -> None:
        try:
            DeferredWork.objects.filter(pk=pk).update(status=Status.PROCESSING, claim_token="b" * 32)
        finally:
            connection.close()

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not done and "COUNT(" in sql.upper():
            done.append(True)
            thread = threading.Thread(target=claim)
            thread.start()
            thread.join()
        return result

    return wrapper


def summary_of(response: Any) -> dict[str | None, int]:
    return {item.value: item.count for item in response.context["cl"].status_summary}


def make_rows(make_work: Any) -> int:
    for status in (Status.DONE, Status.DONE, Status.PENDING, Status.PENDING, Status.PROCESSING):
        make_work(status)
    return make_work(Status.PENDING).pk


def test_a_row_claimed_between_the_counts_is_counted_once(superuser: Any, make_work: Any) -> None:
    claimed = make_rows(make_work)

    with connection.execute_wrapper(claimed_after_the_first_count(claimed)):
        response = client_for(superuser).get(reverse(CHANGELIST))

    summary = summary_of(response)
    assert DeferredWork.objects.get(pk=claimed).status == Status.PROCESSING  # the premise
    assert summary["done"] == 2
    assert summary["pending"] + summary["processing"] == 4, summary
    assert summary[None] == 6 == response.context["cl"].result_count


@pytest.mark.parametrize("database", SNAPSHOTS)
def test_estimated_counts_and_the_rows_shown_are_one_snapshot(
    superuser: Any, make_work: Any, workflow: Any, database: str
) -> None:
    """Past counting.EXACT_UP_TO each status is counted by its own statement: in one
    snapshot, with the page's rows."""
    fill_done(workflow.kind, 25_000)
    claimed = make_rows(make_work)
    client = client_for(superuser)

    with connection.execute_wrapper(claimed_after_the_first_count(claimed)):
        response = client.get(reverse(CHANGELIST), {"status": "pending"})

    summary = summary_of(response)
    assert response.context["cl"].status_counts[None][1]  # the premise: the total is estimated
    assert DeferredWork.objects.get(pk=claimed).status == Status.PROCESSING
    assert (summary["pending"], summary["processing"]) == (3, 1), summary
    shown = [work.pk for work in response.context["cl"].result_list]
    assert len(shown) == response.context["cl"].result_count == 3
    assert claimed in shown


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True, databases=["default", "direct"])
def test_a_router_that_spreads_reads_over_replicas_reads_the_list_in_its_snapshot(
    superuser: Any, make_work: Any, workflow: Any, settings: Any
) -> None:
    """Django's documented router sends each read to a replica of its choice: the page's
    counts and rows are all read where its snapshot is, not some of them elsewhere (there
    the row claimed meanwhile was counted pending in one and processing in another)."""
    from django.db import connections

    settings.DATABASE_ROUTERS = ["tests.testapp.routers.WorkReadFromEitherReplica"]
    fill_done(workflow.kind, 25_000)
    claimed = make_rows(make_work)

    with (
        connection.execute_wrapper(claimed_after_the_first_count(claimed)),
        connections["direct"].execute_wrapper(claimed_after_the_first_count(claimed)),
    ):
        response = client_for(superuser).get(reverse(CHANGELIST), {"status": "pending"})

    summary = summary_of(response)
    assert DeferredWork.objects.using("default").get(pk=claimed).status == Status.PROCESSING
    assert summary["pending"] + summary["processing"] == 4, summary
    shown = [work.pk for work in response.context["cl"].result_list]
    assert len(shown) == response.context["cl"].result_count == summary["pending"]


def fails_at_the_first_count() -> Any:
    """An execute wrapper: the page's first count fails at the server (inside the snapshot;
    on PostgreSQL the error aborts the transaction, as a statement timeout would)."""
    failed: list[bool] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not failed and "COUNT(" in sql.upper():
            failed.append(True)
            return execute("SELECT * FROM nw_no_such_table", None, many, context)
        return execute(sql, params, many, context)

    return wrapper


@pytest.mark.parametrize("database", SNAPSHOTS)
def test_a_refused_filter_or_a_failed_statement_in_the_snapshot_leaves_the_session_as_it_was(
    superuser: Any, make_work: Any, database: str
) -> None:
    """Django's invalid-filter redirect (a NUL in a filter) and a statement that fails
    inside the page's snapshot end it (rolled back): the session is back in autocommit, and
    the next page is read whole."""
    from django.db import ProgrammingError

    make_rows(make_work)
    client = client_for(superuser)
    refused = client.get(reverse(CHANGELIST), {"kind": "a\x00b"})
    assert (refused.status_code, refused["Location"]) == (302, reverse(CHANGELIST) + "?e=1")
    assert (connection.get_autocommit(), connection.in_atomic_block) == (True, False)
    with connection.execute_wrapper(fails_at_the_first_count()), pytest.raises(ProgrammingError):
        client.get(reverse(CHANGELIST))
    assert (connection.get_autocommit(), connection.in_atomic_block) == (True, False)
    page = client.get(reverse(CHANGELIST))
    assert page.status_code == 200
    assert summary_of(page)[None] == 6 == page.context["cl"].result_count

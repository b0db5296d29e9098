"""A prepare whose own query the database refuses (DB-API files many such refusals under
``OperationalError``, its class for outages too) fails its attempt once; only errors about
the session or the server release it uncounted."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import OperationalError, connection

from nexus_workflows import enqueue
from nexus_workflows.database_errors import blames_the_statement, is_database_unavailable
from nexus_workflows.models import DeferredWork, Status
from tests.raw_connections import raw_connection
from tests.test_runner import row, run_once
from tests.testapp.models import Ledger
from tests.testapp.tasks import BAD_QUERY, queries_badly

pytestmark = pytest.mark.django_db(transaction=True)


def refused_query() -> OperationalError:
    with pytest.raises(OperationalError) as raised, connection.cursor() as cursor:
        cursor.execute(BAD_QUERY[connection.vendor])
    return raised.value


def test_the_databases_refusal_of_a_query_blames_the_statement_not_the_database() -> None:
    error = refused_query()
    assert is_database_unavailable(error)  # what the runner's own statements go by
    assert blames_the_statement(error)


def test_errors_of_no_known_code_never_blame_the_statement() -> None:
    assert not blames_the_statement(OperationalError("server closed the connection unexpectedly"))


@pytest.mark.postgresql
def test_a_session_the_server_ended_does_not_blame_the_statement() -> None:
    """pg_terminate_backend: AdminShutdown (57P01), an outage of this session."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    other = raw_connection()
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    with pytest.raises(OperationalError) as raised, connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    connection.close()
    assert is_database_unavailable(raised.value)
    assert not blames_the_statement(raised.value)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_prepare_whose_query_is_refused_walks_its_schedule_instead_of_being_released(
    register_workflow: Any, mode: str
) -> None:
    """It was released as an outage, attempt unchanged, five times per attempt: a bug in a
    prepare's query ran six times per attempt of the schedule."""
    runs: list[int] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        runs.append(1)
        with connection.cursor() as cursor:
            cursor.execute(BAD_QUERY[connection.vendor])

    async def async_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        from asgiref.sync import sync_to_async

        await sync_to_async(prepare)(trigger, checkpoints, save)

    kind = register_workflow(prepare if mode == "sync" else async_prepare, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    stats = run_once(kind)
    assert (stats.released, stats.rescheduled, len(runs)) == (0, 1, 1)
    work = row(work_id)
    assert (work.status, work.attempt) == (Status.PENDING, 1)
    assert work.history[-1]["outcome"] == "rescheduled"


def test_a_run_once_task_whose_query_is_refused_runs_once_and_fails(settings: Any) -> None:
    """The audit's case: a task of no retries ran six times, FAILED with attempts 6 and one
    entry in errors."""
    from django.core.management import call_command

    result = queries_badly.enqueue("q1")
    call_command("runworkflows", "--once")
    result.refresh()
    assert result.status == "FAILED"
    assert result.attempts == 1
    assert [error.exception_class_path for error in result.errors] == ["django.db.utils.OperationalError"]
    assert Ledger.objects.filter(kind="queries_badly").count() == 1
    assert DeferredWork.objects.get().status == Status.ABANDONED

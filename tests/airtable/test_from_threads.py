"""The helpers called from a thread nobody else looks after, as README tells an ``async
def`` prepare to call them (``await asyncio.to_thread(...)``): the start of the base's
window uses that thread's database connection, and no request cycle or runner check
ever closes it. A connection lost there must not fail every later call of the thread."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from nexus_workflows import enqueue
from nexus_workflows.airtable import get_records
from nexus_workflows.models import DeferredWork, Status
from tests.airtable.conftest import BASE
from tests.airtable.emulator import AirtableEmulator
from tests.processes import wait_for
from tests.test_runner_async import FAST, running


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_an_async_prepare_calling_the_helpers_in_a_thread_recovers_after_its_connection_was_lost(
    airtable: AirtableEmulator, airtable_config: Callable[..., None], register_workflow: Callable[..., Any]
) -> None:
    airtable_config(airtable.url, AIRTABLE_MAX_ATTEMPTS=1, **FAST)
    backends: list[int] = []

    def helper_call() -> None:
        get_records(BASE, "Patients")
        backends.append(connection.connection.info.backend_pid)  # this thread's connection

    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await asyncio.to_thread(helper_call)

    kind = register_workflow(prepare, retry_schedule=[1]).kind

    def status(work_id: str) -> str:
        return DeferredWork.objects.get(pk=work_id).status

    def end_the_threads_connections() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [backends])

    with running([kind]) as runner:
        first = enqueue(kind, {"key": "1"})
        wait_for(lambda: status(first) == Status.DONE, timeout=20, what="the first item done")
        # The server ends the thread's idle connection (a restart, a failover, a pooler's
        # or the server's idle timeout).
        end_the_threads_connections()
        second = enqueue(kind, {"key": "2"})
        # Its first try finds the connection gone (released: the database seemed away),
        # the next one reconnects.
        wait_for(lambda: status(second) == Status.DONE, timeout=20, what="the second item done")
        assert runner.stats.done == 2
    # The loop's threads are gone; their connections would keep the test database open.
    end_the_threads_connections()
    assert len(airtable.requests_for("GET")) == 2

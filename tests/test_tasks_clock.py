"""A Django task's ``enqueued_at`` is the database's time (DESIGN.md, "One clock"), not the
enqueuing host's: a web host whose clock is off must not make its tasks look enqueued in
the future or the past, nor out of order with the times the runner stamps."""

from __future__ import annotations

import re
from datetime import datetime

import pytest

from nexus_workflows.clock import database_now
from nexus_workflows.models import DeferredWork
from tests.faults.servers import under_faketime
from tests.processes import ManagePy

try:
    from django.tasks import default_task_backend
except ModuleNotFoundError:  # Django 5.2: the backport
    from django_tasks import default_task_backend

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql, pytest.mark.slow]

ENQUEUE = (
    "from tests.testapp import tasks; "
    "result = tasks.add.enqueue(1, b=2); "
    "print('ENQUEUED', result.id, result.enqueued_at.isoformat())"
)


@pytest.mark.parametrize("offset", ["+10m", "-10m"], ids=["ten-minutes-ahead", "ten-minutes-behind"])
def test_enqueued_at_is_the_databases_time_whatever_the_enqueuing_hosts(offset: str) -> None:
    process = ManagePy("shell", "-c", ENQUEUE, **under_faketime(offset))
    before = database_now("default")
    try:
        assert process.wait(60) == 0, process.output()
        output = process.output()
    finally:
        process.close()
    after = database_now("default")
    match = re.search(r"^ENQUEUED (\S+) (\S+)$", output, re.MULTILINE)
    assert match, output
    result_id, enqueued_at = match[1], datetime.fromisoformat(match[2])
    row = DeferredWork.objects.get(dedupe_key=result_id)
    assert before <= row.created_at <= after
    assert row.updated_at == row.created_at
    # What enqueue() returned is what get_result() reads later, to the microsecond.
    assert enqueued_at == row.created_at == default_task_backend.get_result(result_id).enqueued_at

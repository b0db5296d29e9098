"""``get_result()`` of a stored task whose code cannot be loaded now answers (Django's
contract: it raises only ``TaskResultDoesNotExist``), and its failure sends ``task_finished``:
both raised ``ModuleNotFoundError`` (or ``InvalidTask`` for a queue taken out of ``QUEUES``)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.tasks.compat import TaskResultStatus, task_backends, task_finished
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

GONE = "tests.testapp.tasks_moved_away.record"


def test_a_task_whose_module_is_gone_still_has_a_result_and_its_failure_is_signalled() -> None:
    result = tasks.record.enqueue("moved")
    DeferredWork.objects.filter(dedupe_key=result.id).update(kind=GONE)
    backend = task_backends["default"]

    stored = backend.get_result(result.id)
    assert (stored.status, stored.task.module_path, stored.args) == (TaskResultStatus.READY, GONE, ["moved"])
    assert (stored.task.queue_name, stored.task.backend) == ("default", "default")
    with pytest.raises(ImportError):
        stored.task.call()

    finished: list[Any] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result)

    task_finished.connect(receive)
    try:
        call_command("runworkflows", "--once", stdout=io.StringIO())
    finally:
        task_finished.disconnect(receive)

    assert DeferredWork.objects.get(dedupe_key=result.id).status == Status.ABANDONED
    (signalled,) = finished
    assert (signalled.id, signalled.status) == (result.id, TaskResultStatus.FAILED)
    failed = backend.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    failed.refresh()
    assert failed.errors


def test_a_result_whose_queue_was_taken_out_of_queues_still_answers() -> None:
    result = tasks.record.enqueue("queued")
    DeferredWork.objects.filter(dedupe_key=result.id).update(queue_name="emails")
    narrowed = {"default": {"BACKEND": "nexus_workflows.tasks.DeferredBackend", "QUEUES": ["default"]}}
    with override_settings(TASKS=narrowed):
        stored = task_backends["default"].get_result(result.id)
    assert (stored.status, stored.task.queue_name) == (TaskResultStatus.READY, "emails")
    assert stored.task.module_path == tasks.record.module_path
    assert stored.task.func is tasks.record.func  # its code still loads: it still runs

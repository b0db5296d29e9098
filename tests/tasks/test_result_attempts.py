"""A task's ``attempts`` (``len(worker_ids)``, Django's contract) counts the runs it had: a
claim that ran nothing adds no attempt."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from nexus_workflows.models import DeferredWork, Status
from tests.test_runner import stale
from tests.testapp import tasks
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

try:
    from django.tasks import TaskResultStatus
except ModuleNotFoundError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus


def test_a_run_once_task_whose_runner_died_fails_with_the_one_attempt_it_had() -> None:
    """The reclaim appended its runner to worker_ids and the crash-loop guard then gave the
    task up without running it: attempts 2 for a task that ran once."""
    result = tasks.record.enqueue("lost")
    DeferredWork.objects.filter(dedupe_key=result.id).update(worker_ids=["dead-runner"])
    stale(str(DeferredWork.objects.get(dedupe_key=result.id).pk), attempt=0)

    call_command("runworkflows", "--once", stdout=io.StringIO())

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert (result.attempts, result.worker_ids) == (1, ["dead-runner"])
    assert [error.exception_class_path for error in result.errors] == [
        "nexus_workflows.exceptions.WorkerLost"
    ]
    assert DeferredWork.objects.get(dedupe_key=result.id).status == Status.ABANDONED
    assert not Ledger.objects.filter(kind="record").exists()  # not run again


def test_a_claimed_task_is_ready_until_its_run_marks_its_start() -> None:
    """RUNNING is "currently running": a row a runner's prefetch holds, not started yet,
    showed RUNNING (and a stop that gave it back left it READY with a start time)."""
    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.deferred.transitions import mark_started, release

    result = tasks.record.enqueue("prefetched")
    (work,) = Claimer(kinds=[], using="default", queues=None, worker_id="runner-1").claim_due(1)
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.READY, 1)

    mark_started([work], using="default")
    result.refresh()
    assert result.status == TaskResultStatus.RUNNING

    DeferredWork.objects.filter(pk=work.id).update(started_at=None)  # a stop before the run
    assert release([work]) == 1
    result.refresh()
    assert (result.status, result.attempts) == (TaskResultStatus.READY, 0)
    assert (result.started_at, result.last_attempted_at) == (None, None)

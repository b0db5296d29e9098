"""Django's Tasks API on nexus_workflows: tasks are enqueued and read back through the
public API only (``@task``, ``Task.enqueue``, ``get_result``, ``TaskResult.refresh``,
the task signals) and run by ``manage.py runworkflows``, on the real database. The same
tests run on Django 5.2 (the django-tasks backport), 6.0 and 6.1 (``django.tasks``)."""

from __future__ import annotations

import importlib.abc
import io
import logging
import sys
import threading
import time
import types
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import OperationalError, connection, transaction
from django.test import override_settings
from django.utils import timezone

from nexus_workflows import EnqueueRejected, WorkflowError, sql
from nexus_workflows.deferred import unloadable
from nexus_workflows.json_values import MAX_DEPTH
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.sql.mysql import JSON_DEPTH_LIMIT
from tests.clock import database_resolution_now
from tests.json_like import nested
from tests.processes import ManagePy, wait_for
from tests.testapp import tasks
from tests.testapp.models import Ledger

try:
    from django.tasks import TaskResultStatus, default_task_backend, task, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ModuleNotFoundError:  # Django 5.2: the backport
    from django_tasks import TaskResultStatus, default_task_backend, task, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 2, "SHUTDOWN_GRACE": 1}


def run_once(*args: str) -> str:
    out = io.StringIO()
    call_command("runworkflows", "--once", *args, stdout=out)
    return out.getvalue()


def run_until_finished(result: Any, timeout: float = 20) -> None:
    """Run ``runworkflows --once`` until the task has finished (retries wait for their time)."""
    deadline = time.monotonic() + timeout
    while True:
        run_once()
        result.refresh()
        if result.is_finished:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"task still {result.status} after {timeout}s")
        time.sleep(0.1)


def steps(name: str) -> list[str]:
    return list(Ledger.objects.filter(kind=name).order_by("pk").values_list("step", flat=True))


# --- the backend ------------------------------------------------------------------------


def test_the_backend_declares_what_it_supports() -> None:
    backend = task_backends["default"]
    assert type(backend).__module__ == "nexus_workflows.tasks.backend"
    assert (
        backend.supports_defer,
        backend.supports_async_task,
        backend.supports_get_result,
        backend.supports_priority,
    ) == (True, True, True, True)


def test_a_task_is_a_row_run_by_runworkflows_and_its_result_has_every_field() -> None:
    before = database_resolution_now()
    result = tasks.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == ([2], {"b": 3}, "default")
    assert before <= result.enqueued_at <= timezone.now()
    assert (result.started_at, result.finished_at, result.worker_ids, result.errors) == (None, None, [], [])
    row = DeferredWork.objects.get(dedupe_key=result.id)
    assert (row.kind, row.status, row.queue_name) == ("tests.testapp.tasks.add", Status.PENDING, "default")

    assert "1 done" in run_once()

    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.is_finished
    assert result.errors == []
    assert result.attempts == 1
    assert len(result.worker_ids) == 1
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    fetched = tasks.add.get_result(result.id)
    assert (fetched.id, fetched.status, fetched.return_value, fetched.worker_ids) == (
        result.id,
        TaskResultStatus.SUCCESSFUL,
        5,
        result.worker_ids,
    )
    assert fetched.task.func is tasks.add.func


def test_an_unknown_result_id_raises_task_result_does_not_exist() -> None:
    for result_id in ("0c3a1f9e-3f4e-4a55-9a2b-5b9e7c2d1e00", "not-an-id", "", "1", "\ud800", "a\x00"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)


def test_a_failing_task_is_failed_with_its_error_class_and_traceback_and_runs_once() -> None:
    result = tasks.explode.enqueue("a")
    assert "1 abandoned" in run_once()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    assert result.finished_at is not None
    (error,) = result.errors
    assert error.exception_class is ValueError
    assert error.exception_class_path == "builtins.ValueError"
    assert "the upstream said no" in error.traceback
    assert "Traceback (most recent call last)" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018 - the property raises
    run_once()
    assert steps("explode") == ["done"]  # a task runs once unless asked otherwise


def test_retries_are_a_task_option_and_context_attempt_counts_them() -> None:
    result = tasks.flaky.enqueue(key="a", failures=2)
    assert result.backend == ("default" if tasks.TASK_OPTIONS else "retrying")
    run_once()
    result.refresh()
    assert result.status == TaskResultStatus.READY  # failed once, a retry is due later
    assert [e.exception_class_path for e in result.errors] == ["builtins.ConnectionError"]
    run_until_finished(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 3, "result_id": result.id}
    assert result.attempts == 3
    assert len(result.errors) == 2
    assert steps("flaky") == ["attempt 1", "attempt 2", "attempt 3"]


@pytest.mark.parametrize(("failures", "status"), [(2, "SUCCESSFUL"), (5, "FAILED")])
def test_a_retried_tasks_result_shows_earlier_errors_while_it_runs_and_when_it_finishes(
    failures: int, status: str
) -> None:
    # The TaskResult of TaskContext and of task_finished is the one get_result() gives:
    # every failed attempt's error so far, not only the current attempt's.
    finished: list[Any] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append([error.exception_class_path for error in task_result.errors])

    task_finished.connect(receive)
    try:
        result = tasks.recalls_errors.enqueue(key="a", failures=failures)
        run_until_finished(result)
    finally:
        task_finished.disconnect(receive)
    assert result.status == status
    assert steps("recalls_errors") == [f"attempt {n}: {n - 1} errors" for n in (1, 2, 3)]
    stored = [error.exception_class_path for error in result.errors]
    assert finished == [stored]
    assert stored == ["builtins.ConnectionError"] * min(failures, 3)
    if status == "SUCCESSFUL":
        assert result.return_value == stored[:2]


def test_retries_asked_for_in_the_backend_options() -> None:
    result = tasks.flaky_by_options.enqueue(key="a", failures=2)
    assert result.backend == "retrying"
    run_until_finished(result)
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 3)


def test_a_failed_task_is_logged_once_without_an_empty_traceback_or_its_message() -> None:
    # Django 6 logs on "django.tasks", the backport on "django_tasks"; both receivers are
    # theirs, sent by our runner after the outcome is written.
    logger = logging.getLogger("django_tasks" if "django_tasks" in sys.modules else "django.tasks")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    logger.addHandler(handler)
    try:
        result = tasks.explode.enqueue("a")
        run_once()
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert f"ERROR Task id={result.id} path=tests.testapp.tasks.explode state=FAILED" in text
    assert "NoneType: None" not in text
    assert "the upstream said no" not in text  # the task's message stays in its result


def test_retries_end_in_failure_when_the_schedule_is_exhausted() -> None:
    result = tasks.flaky.enqueue(key="b", failures=10)
    run_until_finished(result)
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 3 == result.attempts  # the first run and two retries


def test_a_permanent_error_fails_at_once_despite_retries() -> None:
    result = tasks.refuses.enqueue("a")
    run_once()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "nexus_workflows.exceptions.PermanentError"
    assert steps("refuses") == ["done"]


def test_a_deferred_task_waits_for_run_after() -> None:
    now = timezone.now()
    later = tasks.record.using(run_after=now + timedelta(hours=1)).enqueue("in an hour")
    soon_at = now + timedelta(seconds=1.5)
    soon = tasks.record.using(run_after=soon_at).enqueue("soon")
    past = tasks.record.using(run_after=now - timedelta(seconds=1)).enqueue("past")
    assert soon.task.run_after == soon_at
    run_until_finished(soon)  # runs --once until it has run: never before its time
    assert soon.status == TaskResultStatus.SUCCESSFUL
    assert soon.started_at >= soon_at
    assert default_task_backend.get_result(soon.id).task.run_after == soon_at
    assert default_task_backend.get_result(past.id).status == TaskResultStatus.SUCCESSFUL
    assert default_task_backend.get_result(later.id).status == TaskResultStatus.READY
    assert sorted(Ledger.objects.values_list("key", flat=True)) == ["past", "soon"]


def test_higher_priority_runs_first_then_first_enqueued() -> None:
    for key, priority in [("low", -10), ("mid-1", 0), ("high-1", 50), ("mid-2", 0), ("high-2", 50)]:
        tasks.record.using(priority=priority).enqueue(key)
    run_once("--concurrency", "1")
    assert list(Ledger.objects.order_by("pk").values_list("key", flat=True)) == [
        "high-1",
        "high-2",
        "mid-1",
        "mid-2",
        "low",
    ]


def test_priority_out_of_range_is_refused_by_django() -> None:
    with pytest.raises(InvalidTask):
        tasks.record.using(priority=101)


def test_a_bool_priority_is_refused() -> None:
    with pytest.raises(InvalidTask, match="priority must be a whole number from -100 to 100; got a bool"):
        tasks.record.using(priority=True)


def test_an_async_task_runs_and_async_enqueue_and_get_result_work() -> None:
    result = async_to_sync(tasks.double.aenqueue)(21)
    run_once()
    fetched = async_to_sync(tasks.double.aget_result)(result.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


def test_enqueue_inside_atomic_is_part_of_the_callers_transaction() -> None:
    class Rollback(Exception):
        pass

    enqueued: list[Any] = []
    with pytest.raises(Rollback), transaction.atomic():  # noqa: PT012 - the rollback is the point
        enqueued.append(tasks.record.enqueue("rolled-back"))
        raise Rollback
    (rolled_back,) = enqueued
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(rolled_back.id)
    with transaction.atomic():
        kept = tasks.record.enqueue("kept")
    run_once()
    assert steps("record") == ["done"]
    assert default_task_backend.get_result(kept.id).return_value == "kept"


def test_each_enqueue_is_a_new_result_never_deduplicated() -> None:
    first, second = tasks.record.enqueue("same"), tasks.record.enqueue("same")
    assert first.id != second.id
    run_once()
    assert steps("record") == ["done", "done"]


def test_signals_are_sent_on_enqueue_start_and_finish() -> None:
    seen: list[tuple[str, str, Any, str]] = []
    finished_status_in_db: list[str] = []

    def receiver(signal_name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((signal_name, task_result.id, task_result.status, sender.__name__))
            if signal_name == "finished":
                # The outcome is written before task_finished is sent.
                finished_status_in_db.append(default_task_backend.get_result(task_result.id).status)

        return receive

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    task_enqueued.connect(receivers["enqueued"])
    task_started.connect(receivers["started"])
    task_finished.connect(receivers["finished"])
    try:
        ok = tasks.add.enqueue(1, 1)
        bad = tasks.explode.enqueue("x")
        assert [s[:3] for s in seen] == [
            ("enqueued", ok.id, TaskResultStatus.READY),
            ("enqueued", bad.id, TaskResultStatus.READY),
        ]
        run_once("--concurrency", "1")
    finally:
        task_enqueued.disconnect(receivers["enqueued"])
        task_started.disconnect(receivers["started"])
        task_finished.disconnect(receivers["finished"])
    assert {s[3] for s in seen} == {"DeferredBackend"}
    assert Counter((s[0], s[1], s[2]) for s in seen[2:]) == Counter(
        [
            ("started", ok.id, TaskResultStatus.RUNNING),
            ("started", bad.id, TaskResultStatus.RUNNING),
            ("finished", ok.id, TaskResultStatus.SUCCESSFUL),
            ("finished", bad.id, TaskResultStatus.FAILED),
        ]
    )
    assert sorted(finished_status_in_db) == sorted([TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED])


def test_an_abandon_whose_answer_was_lost_still_sends_task_finished() -> None:
    """An outage just after the commit of a failed task's abandon: the write went through,
    its answer was lost, and the runner writes it again, matching nothing. The task did
    fail: task_finished is sent once, FAILED, with the stored finished_at, and the run is
    no lost claim. (tests/faults/test_lost_answers.py loses an answer in a real crash.)"""
    finished: list[tuple[str, Any, Any]] = []
    lost_answers: list[str] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        finished.append((task_result.id, task_result.status, task_result.finished_at))

    def lose_the_abandons_answer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        answer = execute(sql, params, many, context)  # autocommit: committed by now
        if not lost_answers and sql.startswith("UPDATE") and Status.ABANDONED in (params or ()):
            lost_answers.append(sql)
            raise OperationalError("server closed the connection unexpectedly")
        return answer

    result = tasks.explode.enqueue("x")
    task_finished.connect(receive)
    try:
        # The runner writes outcomes on the thread that runs it: this one, in --once.
        with connection.execute_wrapper(lose_the_abandons_answer):
            output = run_once("--concurrency", "1")
    finally:
        task_finished.disconnect(receive)
    result.refresh()
    assert len(lost_answers) == 1
    assert finished == [(result.id, TaskResultStatus.FAILED, result.finished_at)]
    assert "1 abandoned" in output, output
    assert "lost" not in output, output


def test_the_times_task_started_and_task_finished_carry_are_the_stored_ones() -> None:
    # A receiver sees the very times get_result() reads later: the database's clock, not
    # the runner host's (task_finished's finished_at was the host's, about a ms off).
    seen: dict[tuple[str, str], tuple[Any, ...]] = {}

    def enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen["enqueued", task_result.id] = (task_result.enqueued_at,)

    def started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen["started", task_result.id] = (task_result.started_at, task_result.last_attempted_at)

    def finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        times = (task_result.started_at, task_result.last_attempted_at, task_result.finished_at)
        seen["finished", task_result.id] = times

    task_enqueued.connect(enqueued)
    task_started.connect(started)
    task_finished.connect(finished)
    try:
        # Done (the batched write of successes), failed at once (abandoned), and done and
        # failed after retries.
        results = [
            tasks.add.enqueue(1, 1),
            tasks.explode.enqueue("x"),
            tasks.flaky.enqueue(key="f", failures=1),
            tasks.flaky.enqueue(key="g", failures=5),
        ]
        for result in results:
            run_until_finished(result)
    finally:
        task_enqueued.disconnect(enqueued)
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    for result in results:
        stored = (result.started_at, result.last_attempted_at, result.finished_at)
        assert None not in stored
        assert seen["enqueued", result.id] == (result.enqueued_at,)  # as stored (created_at)
        assert seen["finished", result.id] == stored
        # The last attempt's start (a retry's started_at stays the first attempt's).
        assert seen["started", result.id] == stored[:2]


def test_a_raising_task_finished_receiver_does_not_stop_the_runner() -> None:
    def broken(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    task_finished.connect(broken)
    try:
        results = [tasks.add.enqueue(n, n) for n in range(3)]
        assert "3 done" in run_once()
    finally:
        task_finished.disconnect(broken)
    for result in results:
        result.refresh()
    assert [r.return_value for r in results] == [0, 2, 4]


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
def test_a_task_finished_receiver_raising_a_base_exception_does_not_stop_the_runner(
    error: type[BaseException], caplog: pytest.LogCaptureFixture
) -> None:
    # send_robust() catches Exception only: SystemExit used to end the runner (its message,
    # which may quote the task's data, printed on its way out) before the next outcome.
    def exits(sender: Any, task_result: Any, **kwargs: Any) -> None:
        raise error(f"cannot notify about {task_result.args[0]}")

    task_finished.connect(exits)
    try:
        ok = tasks.record.enqueue("María López")
        bad = tasks.explode.enqueue("María López")
        out = run_once("--concurrency", "1")
    finally:
        task_finished.disconnect(exits)
    assert "1 done, 0 rescheduled, 1 abandoned" in out
    assert default_task_backend.get_result(ok.id).status == TaskResultStatus.SUCCESSFUL
    assert default_task_backend.get_result(bad.id).status == TaskResultStatus.FAILED
    assert "María" not in caplog.text
    said = f"a receiver of task_finished raised {error.__name__} for tests.testapp.tasks.record #"
    assert said in caplog.text


def test_a_failing_task_finished_receiver_is_logged_by_type_and_place_never_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Receivers that choke on the task's data: Django's send_robust would log their
    # messages, and tracebacks, on "django.dispatch".
    def broken(sender: Any, task_result: Any, **kwargs: Any) -> None:
        raise ValueError(f"cannot notify about {task_result.args[0]}")

    async def broken_async(sender: Any, task_result: Any, **kwargs: Any) -> None:
        raise ValueError(f"cannot notify about {task_result.args[0]} either")

    task_finished.connect(broken)
    task_finished.connect(broken_async)
    try:
        with caplog.at_level(logging.DEBUG):
            result = tasks.record.enqueue("María López 5512345678")
            assert "1 done" in run_once()
    finally:
        task_finished.disconnect(broken)
        task_finished.disconnect(broken_async)
    assert "María" not in caplog.text
    assert "5512345678" not in caplog.text
    work_id = DeferredWork.objects.get(dedupe_key=result.id).pk
    lines = sorted(r.getMessage() for r in caplog.records if r.name == "nexus_workflows.signals")
    path = "tests.testapp.tasks.record"
    about = f"a receiver of task_finished raised ValueError for {path} #{work_id}; ignored"
    assert [line.split(" (")[0] for line in lines] == [about, about]
    assert [line.rsplit(" in ", 1)[1] for line in lines] == ["broken)", "broken_async)"]


def test_a_return_value_json_cannot_hold_fails_the_task() -> None:
    result = tasks.returns_a_set.enqueue("a")
    run_once()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "builtins.TypeError"


@pytest.mark.parametrize("which", ["lone surrogate", "nul", "surrogate key"])
def test_a_return_value_jsonb_cannot_store_fails_the_task_naming_the_task_only(which: str) -> None:
    result = tasks.returns_text.enqueue(which)
    assert "1 abandoned" in run_once()  # on PostgreSQL the write used to fail on every try
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert "task 'tests.testapp.tasks.returns_text' returned text that contains" in error.traceback
    assert "María" not in error.traceback
    row = DeferredWork.objects.get(dedupe_key=result.id)
    assert (row.return_value, "María" in row.last_error) == (None, False)


def test_a_return_value_as_deep_as_the_database_keeps_is_kept_and_a_deeper_one_fails_the_task() -> None:
    """MariaDB keeps JSON documents nested at most 31 deep: a deeper return value failed
    the done-write of every row written with it, on every try. PostgreSQL and SQLite
    keep far deeper ones (100 here), so there no value is refused for its depth."""
    depth = sql.database_json_depth("default")
    kept = tasks.returns_nested.enqueue(depth or 100)
    assert "1 done" in run_once()
    kept.refresh()
    assert (kept.status, kept.return_value) == (TaskResultStatus.SUCCESSFUL, nested(depth or 100))
    if depth is None:
        return
    deeper = tasks.returns_nested.enqueue(depth + 1)
    assert "1 abandoned" in run_once()
    deeper.refresh()
    assert deeper.status == TaskResultStatus.FAILED
    (error,) = deeper.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert f"returned a value nested more than {depth} containers deep" in error.traceback


def test_a_return_value_with_an_escaped_nul_is_text_and_is_kept() -> None:
    result = tasks.returns_text.enqueue("escaped nul")
    assert "1 done" in run_once()
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, "C:\\u0000\\dir")


@pytest.mark.parametrize("which", ["lone surrogate", "nul"])
def test_a_failure_whose_message_jsonb_cannot_store_is_recorded_cleaned(which: str) -> None:
    result = tasks.fails_with_text.enqueue(which)
    assert "1 abandoned" in run_once()  # on PostgreSQL the write used to fail on every try
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    # The traceback is the task's own record (revealed like any error): kept, but cleaned.
    assert "ValueError: could not reach María López" in error.traceback
    assert "\x00" not in error.traceback
    assert "\ud800" not in error.traceback
    error.traceback.encode("utf-8")


def test_runners_can_be_limited_to_queues() -> None:
    email = tasks.record.using(queue_name="emails").enqueue("email")
    report = tasks.record.using(queue_name="reports").enqueue("report")
    default = tasks.record.enqueue("default")
    assert "0 done" in run_once("--kind", "test-ledger")  # workflow kinds only: no tasks
    assert "1 done" in run_once("--queue", "emails")
    assert steps("record") == ["done"]
    assert default_task_backend.get_result(email.id).status == TaskResultStatus.SUCCESSFUL
    assert default_task_backend.get_result(report.id).status == TaskResultStatus.READY
    assert "2 done" in run_once()  # by default: every queue of the configured backends
    assert default_task_backend.get_result(default.id).status == TaskResultStatus.SUCCESSFUL


def test_a_runner_for_a_queue_no_backend_allows_is_refused() -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="1 of the queue names given is not allowed") as raised:
        run_once("--queue", "emails", "--queue", "nowhere-Jane-Doe")
    message = str(raised.value)
    assert "Jane" not in message  # the given names are input: never echoed
    assert "allowed queues (their QUEUES): " in message  # the configured ones are settings
    assert "emails" in message


def test_a_queue_the_backend_does_not_allow_is_refused_by_django() -> None:
    with pytest.raises(InvalidTask):
        tasks.record.using(queue_name="nowhere")


def test_a_task_whose_new_id_is_taken_is_refused_and_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new UUID is never taken; if one were, the enqueue says so (PostgreSQL skips a taken
    key without an error, SQLite refuses it) instead of a result for a row never written."""
    import uuid

    first = tasks.record.enqueue("first")
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(first.id))
    with pytest.raises(EnqueueRejected, match="not written"):
        tasks.record.enqueue("second")
    assert DeferredWork.objects.count() == 1


# --- bad input ----------------------------------------------------------------------------


def test_arguments_that_are_not_json_are_refused_before_anything_is_written() -> None:
    from nexus_workflows.tasks import InvalidTaskArguments

    class Patient:
        def __repr__(self) -> str:
            return "María López"

    circular: list[Any] = ["María López"]
    circular.append(circular)
    for bad in ([Patient()], [float("nan")], ["a\x00b"], [b"Mar\xeda"], [circular]):
        with pytest.raises(InvalidTaskArguments) as caught:
            tasks.record.enqueue(*bad)
        assert isinstance(caught.value, WorkflowError)
        assert isinstance(caught.value, TypeError)
        assert "tests.testapp.tasks.record" in str(caught.value)
        assert "María" not in str(caught.value)
        assert "allowed:" in str(caught.value)
    assert not DeferredWork.objects.exists()


@pytest.mark.parametrize(
    ("args", "kwargs", "rule"),
    [
        # jsonb cannot store these: PostgreSQL's error would quote the arguments.
        (["María López \ud800"], {}, "arguments contains text that is not valid Unicode"),
        ([{"nota": ["María", "\udc00"]}], {}, "arguments contains text that is not valid Unicode"),
        ([], {"key": "María \ud800"}, "keyword arguments contains text that is not valid Unicode"),
        ([{"María \ud800": 1}], {}, "arguments has a dict key that contains text that is not valid"),
        # The rules of a workflow's trigger: what would not come back as given.
        ([{1: "María"}], {}, "has a dict key of type int"),
        ([2**64], {}, "integer outside"),
        ([-0.0], {}, "-0.0"),
    ],
)
def test_arguments_that_would_not_come_back_are_refused_and_the_transaction_goes_on(
    args: list[Any], kwargs: dict[str, Any], rule: str
) -> None:
    from nexus_workflows.tasks import InvalidTaskArguments

    with transaction.atomic():  # the caller's transaction
        with pytest.raises(InvalidTaskArguments) as caught:
            tasks.record.enqueue(*args, **kwargs)
        message = str(caught.value)
        assert rule in message
        assert "tests.testapp.tasks.record" in message
        assert "María" not in message
        assert caught.value.__cause__ is None
        # Refused before any write: the caller's transaction is still usable.
        fine = tasks.record.enqueue("fine")
    assert list(DeferredWork.objects.values_list("dedupe_key", flat=True)) == [fine.id]


def test_arguments_as_deep_as_the_database_keeps_are_taken_and_deeper_ones_refused() -> None:
    """The arguments' list nests at most 64 containers; on MariaDB, whose JSON documents
    nest at most 31 deep, 30: the stored trigger holds it one level down. Deeper was
    refused by the database, as "a constraint or trigger added to the table"."""
    from nexus_workflows.tasks import InvalidTaskArguments

    depth = JSON_DEPTH_LIMIT - 1 if connection.vendor == "mysql" else MAX_DEPTH
    kept = tasks.record.enqueue(nested(depth - 1))  # the list of arguments is one more
    assert DeferredWork.objects.get(dedupe_key=kept.id).trigger["args"] == [nested(depth - 1)]
    with pytest.raises(InvalidTaskArguments, match=f"arguments is nested more than {depth} containers"):
        tasks.record.enqueue(nested(depth))
    assert DeferredWork.objects.count() == 1


@pytest.mark.django_db(transaction=True)  # the constraint is DDL: MariaDB commits it at once
def test_a_database_refusal_of_a_task_is_the_apps_error_without_the_arguments(project_refusal: Any) -> None:
    from nexus_workflows.exceptions import EnqueueRejected

    project_refusal.install("queue_name", "emails")
    with (
        pytest.raises(EnqueueRejected, match="the database refused the new task") as raised,
        transaction.atomic(),
    ):
        tasks.record.using(queue_name="emails").enqueue("María López")
    assert isinstance(raised.value, WorkflowError)
    assert raised.value.__cause__ is None  # the driver's message quotes the row
    assert "María" not in str(raised.value)
    assert "tests.testapp.tasks.record" in str(raised.value)
    if connection.vendor != "sqlite":  # SQLite's message names no trigger
        assert "nw_test_refused" in str(raised.value)
    assert not DeferredWork.objects.exists()


@pytest.mark.skipif(not tasks.TASK_OPTIONS, reason="Django 6.0's @task takes no backend options")
def test_a_bad_retry_schedule_is_refused_when_the_task_is_declared() -> None:
    from nexus_workflows.tasks import InvalidTaskOptions

    def declare(schedule: Any) -> Any:
        return task(retry_schedule=schedule)(tasks._record)

    for schedule in ([-1], [float("inf")], ["5"], [10**9]):
        with pytest.raises(InvalidTaskOptions) as caught:
            declare(schedule)
        assert isinstance(caught.value, InvalidTask)
        assert isinstance(caught.value, WorkflowError)
        assert "retry_schedule" in str(caught.value)


@pytest.mark.parametrize(
    ("options", "check_id"),
    [
        ({"RETRY_SCHEDULE": [0]}, "nexus_workflows.E032"),
        ({"RETRIES": 3}, "nexus_workflows.E031"),
        ({1: 2, "RETRIES": 3}, "nexus_workflows.E031"),  # keys of two types: no crash
    ],
)
def test_backend_options_are_checked(options: dict[str, Any], check_id: str) -> None:
    tasks_setting = {"default": {"BACKEND": "nexus_workflows.tasks.DeferredBackend", "OPTIONS": options}}
    with override_settings(TASKS=tasks_setting):
        messages = list(task_backends["default"].check())
    assert [message.id for message in messages] == [check_id]


@pytest.mark.parametrize("schedule", ["1", 5, {"minutes": 1}])
def test_a_retry_schedule_that_is_no_list_is_refused_in_the_tasks_own_words(schedule: Any) -> None:
    """The message was the workflow rule's: "a non-empty list ... or None for
    fire-and-forget", while a task's schedule may be empty and tasks have no fire-and-forget."""
    tasks_setting = {
        "default": {
            "BACKEND": "nexus_workflows.tasks.DeferredBackend",
            "OPTIONS": {"RETRY_SCHEDULE": schedule},
        }
    }
    with override_settings(TASKS=tasks_setting):
        (message,) = task_backends["default"].check()
    assert message.id == "nexus_workflows.E032"
    assert "fire-and-forget" not in message.msg
    assert "non-empty" not in message.msg
    assert (
        f"must be a list of minutes (empty or None: run once); got {type(schedule).__name__}" in message.msg
    )


@pytest.mark.parametrize(
    ("alias", "queues"),
    [
        ("a" * 101, ["default"]),
        ("default", ["default", "q" * 101]),
        ("default", ["default", ""]),
        ("default", ["default", 7]),
    ],
)
def test_names_no_task_could_be_declared_for_are_checked(alias: str, queues: list[Any]) -> None:
    """They passed the checks, then every @task declared for them raised InvalidTaskOptions."""
    tasks_setting = {alias: {"BACKEND": "nexus_workflows.tasks.DeferredBackend", "QUEUES": queues}}
    with override_settings(TASKS=tasks_setting):
        messages = list(task_backends[alias].check())
    assert [message.id for message in messages] == ["nexus_workflows.E033"]
    assert "q" * 41 not in messages[0].msg
    assert "a" * 41 not in messages[0].msg


# --- the triage desk ----------------------------------------------------------------------


def test_a_failed_task_is_on_the_triage_desk_and_revived_there(admin_client: Any) -> None:
    from nexus_workflows.deferred import triage

    result = tasks.explode.enqueue("a")
    run_once()
    result.refresh()
    page = admin_client.get("/admin/nexus_workflows/deferredwork/?status=attention")
    assert page.status_code == 200
    assert "tests.testapp.tasks.explode" in page.content.decode()
    row = DeferredWork.objects.get(dedupe_key=result.id)
    detail = admin_client.get(f"/admin/nexus_workflows/deferredwork/{row.pk}/change/").content.decode()
    assert "builtins.ValueError" in detail
    assert result.worker_ids[0] in detail
    revived = triage.revive(DeferredWork.objects.filter(dedupe_key=result.id), by="test")
    assert revived.unregistered_kinds == []  # any runner imports a task by its path
    result.refresh()
    assert (result.status, result.finished_at) == (TaskResultStatus.READY, None)
    run_once()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert steps("explode") == ["done", "done"]
    assert len(result.errors) == 2


def test_a_tasks_attempts_count_against_its_schedule_on_the_triage_desk(admin_client: Any) -> None:
    """A task's row shows "2 of 3" (the ``retrying`` backend's schedule), not "2 of ?" and
    "not registered in this project"; a task that cannot be loaded here says that instead."""
    from nexus_workflows.deferred.attempts import describe_attempt

    result = tasks.flaky_by_options.enqueue(key="a", failures=5)
    run_once()  # fails: a retry is due in 0.6 s
    row = DeferredWork.objects.get(dedupe_key=result.id)
    assert (row.status, row.attempt) == (Status.PENDING, 1)
    gone = DeferredWork.objects.create(
        kind="tests.testapp.tasks.gone",
        dedupe_key="gone",
        trigger={"args": [], "kwargs": {}},
        backend_name="default",
        status=Status.ABANDONED,
        attempt=4,
    )
    listing = admin_client.get("/admin/nexus_workflows/deferredwork/").content.decode()
    assert '<span class="nw-attempts">2 of 3</span>' in listing
    assert "This task cannot be loaded in this process" in listing
    assert "5 of" in listing  # the gone task: its number, no cap without a schedule
    detail = admin_client.get(f"/admin/nexus_workflows/deferredwork/{row.pk}/change/").content.decode()
    assert "2 of 3" in detail
    assert describe_attempt(row.kind, row.attempt, row.backend_name) == "attempt 2 of 3"
    assert describe_attempt(gone.kind, gone.attempt, gone.backend_name) == "attempt 5"


def test_a_tasks_attempts_count_against_its_schedule_in_the_runners_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The runner's lines say "attempt 1 of 3", as the CLI and the triage desk do (the
    README: the same way in the logs, the CLI and the admin), not "attempt 1"; the
    ``attempt`` field of the record is the same number."""
    result = tasks.flaky_by_options.enqueue(key="log", failures=5)
    with caplog.at_level(logging.INFO, logger="nexus_workflows.deferred.runner"):
        run_once()  # fails: a retry is due in 0.6 s
    row = DeferredWork.objects.get(dedupe_key=result.id)
    lines = [record.getMessage() for record in caplog.records if f"#{row.pk} " in record.getMessage()]
    assert f"tests.testapp.tasks.flaky_by_options #{row.pk} attempt 1 of 3: started" in lines
    assert any(line.endswith("attempt 2 of 3 in 0.6s") for line in lines), lines
    started = next(record for record in caplog.records if record.getMessage().endswith("started"))
    assert started.attempt == 1


class ImportSearches(importlib.abc.MetaPathFinder):
    """Counts the import system's searches for one module (each failed import searches
    again), finding nothing itself: the real finders after it answer."""

    def __init__(self, module: str) -> None:
        self.module = module
        self.count = 0

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        if fullname == self.module:
            self.count += 1


def test_a_task_that_cannot_be_loaded_is_looked_up_once_for_a_page_of_its_rows(
    admin_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its failed load is remembered for a while (RECHECK_AFTER), not tried for each row
    (twice per row before: the cap, then the number), and tried again once that passed."""
    from nexus_workflows.deferred.registry import registry

    registry.unloadable_tasks.forget()
    # Its clock, moved by the test: a page's requests take what they take (under load,
    # more than a short real RECHECK_AFTER), and the recheck comes when the test says.
    clock = types.SimpleNamespace(now=1_000.0)
    monkeypatch.setattr(unloadable, "time", types.SimpleNamespace(monotonic=lambda: clock.now))
    for number in range(5):
        DeferredWork.objects.create(
            kind="tests.testapp.vanished_tasks.send_reminder",
            dedupe_key=f"vanished-{number}",
            trigger={"args": [], "kwargs": {}},
            backend_name="default",
            status=Status.ABANDONED,
            attempt=number,
        )
    key = ("tests.testapp.vanished_tasks.send_reminder", "default")
    searches = ImportSearches("tests.testapp.vanished_tasks")
    sys.meta_path.insert(0, searches)
    try:
        listing = admin_client.get("/admin/nexus_workflows/deferredwork/").content.decode()
        assert listing.count("This task cannot be loaded in this process") == 5
        assert searches.count == 1
        admin_client.get("/admin/nexus_workflows/deferredwork/")
        assert searches.count == 1  # within RECHECK_AFTER: remembered
        clock.now += registry.unloadable_tasks.recheck_after - 0.1
        assert key in registry.unloadable_tasks
        clock.now += 0.2
        assert key not in registry.unloadable_tasks
        admin_client.get("/admin/nexus_workflows/deferredwork/")
        assert searches.count == 2  # a deploy may have added it: tried again, once
    finally:
        sys.meta_path.remove(searches)


# --- real runner processes ----------------------------------------------------------------


def _wait_for_start_marker(result_id: str) -> None:
    """Until the runner has written that the attempt started (its heartbeat thread does,
    shortly after): a runner killed before that lost a claim, not an attempt, and the
    task would simply run again (issue 20)."""
    wait_for(
        lambda: DeferredWork.objects.filter(dedupe_key=result_id, started_at__isnull=False).exists(),
        timeout=30,
        what="the attempt's start marker",
    )


def _kill_mid_attempt_then_rescue(result: Any, release: Path, name: str, started: list[str]) -> Any:
    """Run the task in a runner, kill it once the attempt has started (``steps(name)`` is
    ``started`` and its start marker is written), then let a second runner finish it.
    Returns the task's status seen right after the kill."""
    doomed = ManagePy("runworkflows", settings=FAST)
    rescuer = None
    try:
        wait_for(lambda: steps(name) == started, timeout=30, what="the attempt to start")
        _wait_for_start_marker(result.id)
        doomed.kill()
        status_when_killed = default_task_backend.get_result(result.id).status
        release.touch()
        rescuer = ManagePy("runworkflows", settings=FAST)
        wait_for(
            lambda: default_task_backend.get_result(result.id).is_finished,
            timeout=60,
            what="the lost attempt's task to be reclaimed and finished",
        )
        rescuer.terminate()
    finally:
        doomed.close()
        if rescuer:
            rescuer.close()
    return status_when_killed


@pytest.mark.slow
def test_a_task_whose_runner_is_killed_is_reclaimed_and_retried(tmp_path: Path) -> None:
    release = tmp_path / "release"
    result = tasks.hold.enqueue("a", release_file=str(release))
    status_when_killed = _kill_mid_attempt_then_rescue(result, release, "hold", ["attempt 1"])
    assert status_when_killed == TaskResultStatus.RUNNING
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 2)
    assert len(set(result.worker_ids)) == 2 == result.attempts
    assert steps("hold") == ["attempt 1", "attempt 2"]


@pytest.mark.slow
def test_a_task_without_retries_whose_runner_is_killed_fails_without_running_again(tmp_path: Path) -> None:
    release = tmp_path / "release"
    result = tasks.hold_once.enqueue("a", release_file=str(release))
    _kill_mid_attempt_then_rescue(result, release, "hold_once", ["done"])
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "nexus_workflows.exceptions.WorkerLost"
    assert result.attempts == 1 == len(result.worker_ids)  # the rescuer ran nothing
    assert steps("hold_once") == ["done"]


def test_enqueue_from_many_threads_gives_distinct_results() -> None:
    ids: list[str] = []
    lock = threading.Lock()

    def enqueue_some() -> None:
        from django.db import connection

        try:
            for n in range(10):
                result = tasks.add.enqueue(n, 1)
                with lock:
                    ids.append(result.id)
        finally:
            connection.close()

    threads = [threading.Thread(target=enqueue_some) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 30
    assert "30 done" in run_once()


def test_a_task_abandoned_for_its_lost_runner_is_numbered_within_its_schedule() -> None:
    """A task whose only attempt started in a runner that died is abandoned by the next
    runner's reclaim; the signal numbers that attempt against the task's schedule (1 of 1),
    not one past it, as the log, the CLI and the admin do."""
    from nexus_workflows import signals as app_signals

    result = tasks.record.enqueue("lost")
    DeferredWork.objects.filter(dedupe_key=result.id).update(
        status=Status.PROCESSING,
        claim_token="a-runner-that-died",
        heartbeat_at=timezone.now() - timedelta(hours=1),
        started_at=timezone.now() - timedelta(hours=1),
    )
    abandoned: list[int] = []

    def receiver(sender: Any, attempt: int, **kwargs: Any) -> None:
        abandoned.append(attempt)

    app_signals.work_abandoned.connect(receiver, weak=False)
    try:
        run_once()
    finally:
        app_signals.work_abandoned.disconnect(receiver)
    assert DeferredWork.objects.get(dedupe_key=result.id).status == Status.ABANDONED
    assert abandoned == [1]

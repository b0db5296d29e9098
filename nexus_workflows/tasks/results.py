"""A Django task's row as a ``TaskResult``: what ``get_result()`` returns and the runner
hands to a task's context."""

from __future__ import annotations

import dataclasses
import types
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from nexus_workflows.tasks.compat import InvalidTask, Task, TaskError, TaskResult, TaskResultStatus

# A row's status as a TaskResult's status (a processing row whose run has not started is
# READY: see result_from_row).
_STATUSES = {
    "pending": TaskResultStatus.READY,
    "processing": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "abandoned": TaskResultStatus.FAILED,
}

# What get_result reads: everything a TaskResult shows.
RESULT_FIELDS = (
    "kind",
    "dedupe_key",
    "trigger",
    "status",
    "priority",
    "queue_name",
    "backend_name",
    "created_at",
    "first_started_at",
    "started_at",
    "last_attempted_at",
    "finished_at",
    "worker_ids",
    "errors",
    "return_value",
)


def load_task(path: str) -> Task:
    """The Task object at ``path``; raises ``ImportError``/``ValueError`` when it is gone."""
    task = import_string(path)
    if not isinstance(task, Task):
        raise ValueError(f"{path!r} does not point to a Task (it is a {type(task).__name__})")
    return task


def task_as_enqueued(path: str, row: dict[str, Any]) -> Task:
    """The task with the priority, queue, backend and ``run_after`` it was enqueued with."""
    task = load_task(path)
    run_after = _run_after(row["trigger"])
    if (task.priority, task.queue_name, task.backend, run_after) == (
        row["priority"],
        row["queue_name"],
        row["backend_name"],
        None,
    ):
        return task  # the common case: no validation again
    return task.using(
        priority=row["priority"],
        queue_name=row["queue_name"],
        backend=row["backend_name"],
        run_after=run_after,
    )


def _run_after(trigger: dict[str, Any]) -> datetime | None:
    value = trigger.get("run_after") if isinstance(trigger, dict) else None
    return parse_datetime(value) if isinstance(value, str) else None


def _unloadable(*args: Any, **kwargs: Any) -> Any:
    raise ImportError("this task's code could not be loaded when its result was read")


def stored_task(path: str, row: dict[str, Any], loaded: Task | None = None) -> Task:
    """The task of a stored row as it was enqueued, built without Django's validation,
    which refuses it now: its options no longer pass (a queue taken out of ``QUEUES``:
    ``loaded`` is the task, whose code still runs), or its code cannot be loaded (moved or
    removed since the enqueue: a stand-in with the stored path as ``module_path``, which
    raises ``ImportError`` when called). So ``get_result()`` still answers, as Django's
    contract says it does, with the stored priority, queue and backend."""
    if loaded is not None:
        func, takes_context = loaded.func, loaded.takes_context
    else:
        module, _, name = path.rpartition(".")
        func = types.FunctionType(_unloadable.__code__, _unloadable.__globals__, name)
        func.__module__, func.__qualname__ = module, name
        takes_context = False
    values = {
        "func": func,
        "priority": row["priority"],
        "backend": row["backend_name"],
        "queue_name": row["queue_name"],
        "run_after": _run_after(row["trigger"]),
        "takes_context": takes_context,
    }
    task = object.__new__(type(loaded) if loaded is not None else Task)
    for field in dataclasses.fields(task):
        default = getattr(loaded, field.name, field.default)
        object.__setattr__(task, field.name, values.get(field.name, default))
    return task


def _task_of(row: dict[str, Any]) -> Task:
    path = row["kind"]
    try:
        loaded = load_task(path)
    except (ImportError, ValueError):
        return stored_task(path, row)
    try:
        return task_as_enqueued(path, row)
    except InvalidTask:
        return stored_task(path, row, loaded)


def result_from_row(row: dict[str, Any]) -> TaskResult:
    status = _STATUSES[row["status"]]
    if status == TaskResultStatus.RUNNING and row["started_at"] is None:
        # Claimed, its run not started: a runner's prefetch holds it, or a stop gives it
        # back. RUNNING is "currently running"; a run marks its start (started_at) within
        # 0.1 s, and a save marks it too.
        status = TaskResultStatus.READY
    finished = status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
    trigger = row["trigger"] or {}
    result: TaskResult[Any] = TaskResult(
        task=_task_of(row),
        id=row["dedupe_key"],
        status=status,
        enqueued_at=row["created_at"],
        started_at=row["first_started_at"],
        last_attempted_at=row["last_attempted_at"],
        finished_at=row["finished_at"] if finished else None,
        args=trigger.get("args", []),
        kwargs=trigger.get("kwargs", {}),
        backend=row["backend_name"],
        errors=[error_of(entry) for entry in row["errors"] or []],
        worker_ids=list(row["worker_ids"] or []),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row["return_value"])
    return result


def error_of(entry: dict[str, Any]) -> TaskError:
    return TaskError(
        exception_class_path=str(entry.get("exception_class_path", "")),
        traceback=str(entry.get("traceback", "")),
    )

"""How ``runworkflows`` runs a claimed Django task, and what it tells Django afterwards.

A task's row is run through a :class:`TaskWorkflow`: a deferred workflow whose retry
schedule is the task's (none unless asked for), so retries, permanent errors, reclaims and
abandonment work exactly as for workflows. ``task_started`` is sent in the worker thread
just before the function runs; ``task_finished`` once the final outcome (SUCCESSFUL or
FAILED) is written, so a receiver that calls ``get_result()`` sees it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from traceback import format_exception
from typing import TYPE_CHECKING, Any, ClassVar

from nexus_workflows import sql
from nexus_workflows.deferred.history import storable_text, truncate
from nexus_workflows.deferred.registry import Workflow
from nexus_workflows.json_values import nested_deeper, text_problem
from nexus_workflows.limits import TRACEBACK_MAX_LENGTH
from nexus_workflows.signals import send_quietly

if TYPE_CHECKING:
    from nexus_workflows.deferred.transitions import ClaimedWork

logger = logging.getLogger(__name__)


def _not_enqueued_here(trigger: Any) -> str:
    raise TypeError("Django tasks are enqueued with Task.enqueue(), not nexus_workflows.enqueue()")


def _run_through_run_task(*args: Any) -> None:
    raise TypeError("a TaskWorkflow runs through run_task()")


@dataclass(frozen=True)
class TaskWorkflow(Workflow):
    """The workflow face of one task path on one backend alias (``loaded`` False: the task
    or its backend could not be loaded here, so its retry schedule is unknown)."""

    backend_alias: str = ""
    loaded: bool = True
    runs_task: ClassVar[bool] = True

    def run_task(self, work: ClaimedWork) -> None:
        """Run one attempt; sets ``work.return_value`` (JSON), or ``work.error_record`` and
        re-raises when the task (or loading it) failed."""
        try:
            self._run(work)
        except BaseException as error:
            work.error_record = error_record(error)
            raise

    def _run(self, work: ClaimedWork) -> None:
        from nexus_workflows.tasks.compat import (
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
            task_started,
        )
        from nexus_workflows.tasks.results import error_of, task_as_enqueued

        columns = work.columns
        task = task_as_enqueued(self.kind, {**columns, "trigger": work.trigger})
        backend = task_backends[self.backend_alias]
        trigger = work.trigger if isinstance(work.trigger, dict) else {}
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=work.dedupe_key,
            status=TaskResultStatus.RUNNING,
            enqueued_at=columns.get("created_at"),
            started_at=columns.get("first_started_at"),
            last_attempted_at=columns.get("last_attempted_at"),
            finished_at=None,
            args=trigger.get("args", []),
            kwargs=trigger.get("kwargs", {}),
            backend=self.backend_alias,
            # Those of earlier attempts: task_finished adds this one's to the same list.
            errors=[error_of(entry) for entry in columns.get("errors") or []],
            worker_ids=list(columns.get("worker_ids") or []),
        )
        work.task_result = result
        task_started.send(sender=type(backend), task_result=result)
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *result.args, **result.kwargs)
        else:
            value = task.call(*result.args, **result.kwargs)
        depth = sql.database_json_depth(work.using)
        work.return_value = stored_return_value(self.kind, value, database_depth=depth)


def stored_return_value(path: str, value: Any, *, database_depth: int | None = None) -> Any:
    """The return value as the database will keep it; a value it cannot keep fails the
    attempt (as in django-tasks-db), so the error is recorded instead of breaking the write
    (on PostgreSQL a value jsonb refuses would leave the row processing for good; on
    MariaDB one nested deeper than ``database_depth`` would fail the done-write of every
    row written with it). The messages name the task, never the value."""
    from nexus_workflows.tasks.compat import normalize_json

    try:
        value = normalize_json(value)
    except RecursionError:
        raise ValueError(
            f"task {path!r} returned a value that contains itself or is nested too deep"
        ) from None
    try:
        text = json.dumps(value, allow_nan=False)
    except ValueError:
        raise ValueError(
            f"task {path!r} returned NaN, infinity or an integer too long to write, which JSON cannot hold"
        ) from None
    problem = _text_problem(value)
    if problem:
        raise ValueError(f"task {path!r} returned text that {problem}; return valid text without NUL")
    if database_depth is not None and nested_deeper(value, database_depth):
        raise ValueError(
            f"task {path!r} returned a value nested more than {database_depth} containers deep, "
            "the most this database keeps in one JSON document"
        )
    # As the column gives it back (an integer key is a string there), so that task_finished's
    # result and a later get_result() carry the same value.
    return json.loads(text)


def _text_problem(value: Any) -> str | None:
    """Why a string (or key) in a JSON value cannot be stored: a NUL or a lone surrogate.
    ``value`` passed json.dumps, so it has no cycle."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return problem
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def error_record(error: BaseException) -> dict[str, str]:
    kind = type(error)
    # The end of a long traceback is where its cause is. Cleaned like the history's text:
    # a NUL or lone surrogate from the exception's message would make the outcome's write
    # fail on every try.
    text = truncate("".join(format_exception(error))[::-1], TRACEBACK_MAX_LENGTH)[::-1]
    return {
        "exception_class_path": storable_text(f"{kind.__module__}.{kind.__qualname__}"),
        "traceback": storable_text(text),
    }


_workflows: dict[tuple[str, str], TaskWorkflow] = {}
_lock = threading.Lock()


def task_workflow(path: str, backend_alias: str) -> TaskWorkflow:
    """The workflow that runs ``path`` enqueued on ``backend_alias``. When the task (or the
    backend) cannot be loaded, the attempt fails with that error and is not retried."""
    key = (path, backend_alias)
    workflow = _workflows.get(key)
    if workflow is not None:
        return workflow
    try:
        from nexus_workflows.tasks.backend import DeferredBackend
        from nexus_workflows.tasks.compat import task_backends
        from nexus_workflows.tasks.results import load_task

        backend = task_backends[backend_alias]
        schedule = backend.retry_schedule_for(load_task(path)) if isinstance(backend, DeferredBackend) else ()
    except Exception:  # noqa: BLE001 - the attempt reports it: run_task raises it again
        return TaskWorkflow(
            path, _not_enqueued_here, _run_through_run_task, (), backend_alias=backend_alias, loaded=False
        )
    workflow = TaskWorkflow(
        path, _not_enqueued_here, _run_through_run_task, schedule, backend_alias=backend_alias
    )
    with _lock:
        _workflows[key] = workflow
    return workflow


def send_finished(works: Iterable[ClaimedWork], *, succeeded: bool) -> None:
    """Send ``task_finished`` for the tasks among ``works`` whose final outcome was just
    written. A receiver that raises (anything, SystemExit included) is logged (its error type
    only) and never stops the runner."""
    from nexus_workflows.tasks.compat import TaskError, TaskResultStatus, task_backends, task_finished

    for work in works:
        if not work.is_task:
            continue
        try:
            result = work.task_result
            if result is None:  # never started: lost too often, or the task could not be loaded
                from nexus_workflows.tasks.compat import TaskResultDoesNotExist

                try:
                    result = task_backends[work.columns.get("backend_name", "")].get_result(work.dedupe_key)
                except TaskResultDoesNotExist:
                    continue
            else:
                # The stored time (the database's clock), which get_result() reads too.
                object.__setattr__(result, "finished_at", work.finished_at)
                if succeeded:
                    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
                    object.__setattr__(result, "_return_value", work.return_value)
                else:
                    object.__setattr__(result, "status", TaskResultStatus.FAILED)
                    if work.error_record:
                        result.errors.append(TaskError(**work.error_record))
            sender = type(task_backends[result.backend])
            # Not send_robust() itself: Django would log a failing receiver's message,
            # which may quote the task's arguments.
            about = f"{work.kind} #{work.id}"
            # contain_exits: a receiver's SystemExit or KeyboardInterrupt, which send_robust
            # lets through, would end the runner (printing its message), outcomes unwritten.
            send_quietly(
                task_finished, sender, "task_finished", about, contain_exits=True, task_result=result
            )
        except Exception as error:  # noqa: BLE001 - the outcome is written; never stop the runner
            logger.error(
                "could not send task_finished for %s #%s: %s", work.kind, work.id, type(error).__name__
            )


def configured_queues() -> list[str] | None:
    """The queues of every :class:`DeferredBackend` in ``TASKS``: what a runner takes by
    default. ``None`` means every queue (a backend whose ``QUEUES`` is empty accepts any
    name; one without ``QUEUES`` accepts only Django's ``"default"``)."""
    try:
        from nexus_workflows.tasks.backend import DeferredBackend
        from nexus_workflows.tasks.compat import task_backends
    except ImportError:  # neither django.tasks nor the backport: no tasks to run
        return []
    queues: set[str] = set()
    for backend in task_backends.all():
        if isinstance(backend, DeferredBackend):
            if not backend.queues:
                return None
            queues.update(backend.queues)
    return sorted(queues)

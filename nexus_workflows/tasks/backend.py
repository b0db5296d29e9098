"""The backend: ``Task.enqueue()`` writes a row of :class:`~nexus_workflows.models.DeferredWork`
and ``get_result()`` reads it back; ``manage.py runworkflows`` runs it (see ``running``)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import DatabaseError, DataError, IntegrityError, router
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from nexus_workflows import json_values, sql
from nexus_workflows.exceptions import EnqueueError, EnqueueRejected, RegistrationError
from nexus_workflows.limits import (
    BACKEND_ALIAS_MAX_LENGTH,
    KIND_COLUMN_LENGTH,
    MAX_DELAY,
    QUEUE_NAME_MAX_LENGTH,
)
from nexus_workflows.numbers import is_finite
from nexus_workflows.redaction import describe
from nexus_workflows.tasks.compat import (
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from nexus_workflows.tasks.results import RESULT_FIELDS, result_from_row

#: The backend's OPTIONS and what each must be.
OPTION_RULES = {
    "RETRY_SCHEDULE": "a list of minutes between attempts (empty: run once)",
}


class InvalidTaskOptions(RegistrationError, InvalidTask):
    """A task's retry schedule (or the backend's ``RETRY_SCHEDULE``) breaks the rules of a
    workflow's retry schedule, or a name is too long for its column."""


class InvalidTaskArguments(EnqueueError, TypeError):
    """A task was enqueued with arguments that cannot be stored as JSON."""


def schedule_of(owner: str, value: object) -> tuple[float, ...]:
    """A retry schedule checked like a workflow's (finite positive minutes, each shorter
    than ``RETENTION``); ``None`` or empty means the task runs once."""
    from nexus_workflows.deferred.registry import _validate_schedule

    if value is None or (isinstance(value, list | tuple) and not value):
        return ()
    if not isinstance(value, list | tuple):  # the workflow rule's message speaks of fire-and-forget
        raise InvalidTaskOptions(
            f"task {owner!r}: retry_schedule must be a list of minutes (empty or None: run once); "
            f"got {type(value).__name__}"
        )
    try:
        return _validate_schedule(owner, value) or ()
    except RegistrationError as error:
        raise InvalidTaskOptions(str(error).replace("workflow ", "task ", 1)) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeferredTask(Task):
    """A task of :class:`DeferredBackend`: Django's ``Task`` plus ``retry_schedule``, the
    minutes to wait before each retry (on Django 6.1, ``@task(retry_schedule=[1, 10])``)."""

    retry_schedule: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.retry_schedule, list):
            object.__setattr__(self, "retry_schedule", tuple(self.retry_schedule))
        Task.__post_init__(self)  # zero-argument super() does not work in a slots dataclass


class DeferredBackend(BaseTaskBackend):
    """Tasks as durable rows run by ``manage.py runworkflows``.

    ``TASKS = {"default": {"BACKEND": "nexus_workflows.tasks.DeferredBackend"}}``; its
    ``OPTIONS`` may give a ``RETRY_SCHEDULE`` for every task of this backend that does not
    set its own.
    """

    task_class = DeferredTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    # --- validation ---------------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        _check_option_types(task)  # before Django's checks, which compare and hash them
        super().validate_task(task)
        path = task.module_path
        if len(path) > KIND_COLUMN_LENGTH:
            raise InvalidTaskOptions(
                f"task {path[:80]!r}…: its import path has {len(path)} characters; at most "
                f"{KIND_COLUMN_LENGTH} are allowed"
            )
        if not isinstance(task.queue_name, str) or not 0 < len(task.queue_name) <= QUEUE_NAME_MAX_LENGTH:
            raise InvalidTaskOptions(
                f"task {path!r}: queue_name must be a non-empty string of at most "
                f"{QUEUE_NAME_MAX_LENGTH} characters"
            )
        if len(self.alias) > BACKEND_ALIAS_MAX_LENGTH:
            raise InvalidTaskOptions(
                f"task backend alias {self.alias[:40]!r}…: at most {BACKEND_ALIAS_MAX_LENGTH} characters"
            )
        schedule_of(path, getattr(task, "retry_schedule", None))

    def retry_schedule_for(self, task: Task) -> tuple[float, ...]:
        """The task's own schedule, else the backend's ``RETRY_SCHEDULE``, else none."""
        own = getattr(task, "retry_schedule", None)
        if own is not None:
            return schedule_of(task.module_path, own)
        return schedule_of(f"backend {self.alias}", self.options.get("RETRY_SCHEDULE"))

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = list(super().check(**kwargs))
        if not apps.is_installed("nexus_workflows"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses {type(self).__name__}, but nexus_workflows is not "
                    "in INSTALLED_APPS.",
                    hint="Add 'nexus_workflows' to INSTALLED_APPS and run migrate.",
                    id="nexus_workflows.E030",
                )
            )
        unknown = sorted(map(str, set(self.options) - set(OPTION_RULES)))  # keys of any type
        if unknown:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS'] has unknown option(s): "
                    f"{', '.join(map(str, unknown))}.",
                    hint=f"Known options: {', '.join(sorted(OPTION_RULES))}.",
                    id="nexus_workflows.E031",
                )
            )
        # Stored in columns of these lengths: longer names passed the checks, then failed
        # every @task declared for them (InvalidTaskOptions).
        too_long = len(self.alias) > BACKEND_ALIAS_MAX_LENGTH or any(
            not isinstance(queue, str) or not 0 < len(queue) <= QUEUE_NAME_MAX_LENGTH for queue in self.queues
        )
        if too_long:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias[:40]!r}]: the alias must have at most {BACKEND_ALIAS_MAX_LENGTH} "
                    f"characters and each of its QUEUES be a string of 1 to {QUEUE_NAME_MAX_LENGTH}.",
                    hint="Use shorter names: no task could be declared for these.",
                    id="nexus_workflows.E033",
                )
            )
        try:
            schedule_of(f"backend {self.alias}", self.options.get("RETRY_SCHEDULE"))
        except InvalidTaskOptions as error:
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]['OPTIONS']['RETRY_SCHEDULE'] is invalid: {error}",
                    hint=f"It must be {OPTION_RULES['RETRY_SCHEDULE']}.",
                    id="nexus_workflows.E032",
                )
            )
        return messages

    # --- enqueue ------------------------------------------------------------------------

    # sensitive_variables, as the app's enqueue: an error report (Django's, DEBUG off) of a
    # failure in here or below shows no frame's variables: a task's arguments, and a stored
    # row's, are patient data as a trigger is (aenqueue and aget_result come through here).
    @sensitive_variables()
    def enqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        from nexus_workflows.deferred.inserts import insert_pending_stamped
        from nexus_workflows.deferred.wakeup import notify
        from nexus_workflows.models import DeferredWork

        self.validate_task(task)
        using = router.db_for_write(DeferredWork)
        trigger = _trigger(task, args, kwargs, max_depth=sql.json_depth(using, nested_in=1))
        result_id = str(uuid.uuid4())
        now = timezone.now()
        # Inside the caller's atomic() this is one more statement of its transaction:
        # no dedupe race to lose (the key is new), so no savepoint either. The arguments
        # go apart from the statement's text, as enqueue's trigger does.
        try:
            with sql.for_connection(using).values_sent_apart(using):
                inserted = insert_pending_stamped(
                    using,
                    kind=task.module_path,
                    dedupe_key=result_id,
                    trigger=trigger,
                    run_after=task.run_after,  # else due now, by the database's clock
                    now=now,
                    priority=task.priority,
                    queue_name=task.queue_name,
                    backend_name=self.alias,
                )
        except (IntegrityError, DataError) as error:  # the key is a new UUID: never a dedupe race
            raise _refused(task, error, using) from None
        if inserted is None:  # its new UUID taken (PostgreSQL skips a taken key): never seen
            raise EnqueueRejected(f"task {task.module_path!r}: its new id was taken; it was not written")
        notify(using, inserted=True)
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=result_id,
            status=TaskResultStatus.READY,
            enqueued_at=inserted[1],  # created_at as stored: the database's clock on PostgreSQL
            started_at=None,
            last_attempted_at=None,
            finished_at=None,
            args=trigger["args"],
            kwargs=trigger["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    # --- results ------------------------------------------------------------------------

    @sensitive_variables()  # as enqueue's
    def get_result(self, result_id: str) -> TaskResult:
        from nexus_workflows.models import DeferredWork

        using = router.db_for_read(DeferredWork)
        row = None
        if isinstance(result_id, str) and json_values.text_problem(result_id) is None:  # else no row has it
            row = (
                DeferredWork.objects.using(using)
                .tasks()
                .filter(dedupe_key=result_id)
                .values(*RESULT_FIELDS)
                .first()
            )
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return result_from_row(row)


def _check_option_types(task: Task) -> None:
    """A task's priority, queue name and ``run_after`` of the types Django's own checks
    take (they raised TypeError, ValueError or AttributeError for others), and a
    ``run_after`` within ten years of now (``limits.MAX_DELAY``: the stored due time must
    stay within every database's range, and what reads it back). Named by type only."""
    path, priority, run_after = task.module_path, task.priority, task.run_after
    # A bool is an int to Django: True would run as priority 1.
    if isinstance(priority, bool) or not isinstance(priority, int | float) or not is_finite(priority):
        raise InvalidTaskOptions(
            f"task {path!r}: priority must be a whole number from {TASK_MIN_PRIORITY} to "
            f"{TASK_MAX_PRIORITY}; got {describe(priority)}"
        )
    if not isinstance(task.queue_name, str):
        raise InvalidTaskOptions(
            f"task {path!r}: queue_name must be a string; got {describe(task.queue_name)}"
        )
    if run_after is None:
        return
    if not isinstance(run_after, datetime):
        raise InvalidTaskOptions(
            f"task {path!r}: run_after must be None or an aware datetime; got {describe(run_after)}"
        )
    if run_after.utcoffset() is None:
        return  # naive: Django's own check says it must be aware
    try:
        far = abs(run_after - timezone.now()) > MAX_DELAY
    except OverflowError:  # near datetime's own limits, in a zone that pushes it past them
        far = True
    if far:
        raise InvalidTaskOptions(f"task {path!r}: run_after must be within ten years of now")


def _trigger(
    task: Task, args: Sequence[Any], kwargs: dict[str, Any], *, max_depth: int = json_values.MAX_DEPTH
) -> dict[str, Any]:
    """``{"args": …, "kwargs": …}`` (and ``run_after``) as stored, after checking that it
    comes back exactly as given, by the rules of a workflow's trigger (``json_values``):
    what jsonb cannot store (a NUL, a lone surrogate) must never reach the INSERT, whose
    error would quote the arguments and abort the caller's transaction. The lists of
    arguments nest at most ``max_depth`` containers. Messages name the task and the rule,
    never the values."""
    try:
        # Django's own normalisation first (tuples to lists, bytes to text), as its
        # backends do; what it cannot convert is named by type.
        data = {"args": normalize_json(args), "kwargs": normalize_json(kwargs)}
    except RecursionError:  # normalize_json recurses: a container inside itself, or very deep
        raise InvalidTaskArguments(
            f"task {task.module_path!r}: the arguments contain themselves or are nested too deep; "
            f"{json_values.ALLOWED}"
        ) from None
    except (TypeError, ValueError):
        raise InvalidTaskArguments(
            f"task {task.module_path!r}: the arguments hold a {_unsupported(args, kwargs)}; "
            f"{json_values.ALLOWED}"
        ) from None
    for name, what in (("args", "arguments"), ("kwargs", "keyword arguments")):
        try:
            json_values.check(data[name], max_depth=max_depth)
        except json_values.Rejected as problem:
            raise InvalidTaskArguments(
                f"task {task.module_path!r}: the {what} {problem}; {json_values.allowed(max_depth)}"
            ) from None
    if task.run_after is not None:
        data["run_after"] = task.run_after.isoformat()
    return data


def _refused(task: Task, error: DatabaseError, using: str) -> EnqueueRejected:
    """The app's error for a database refusal of a valid row: the constraint's name,
    never the driver's message, which quotes the row (the arguments)."""
    return EnqueueRejected(
        f"task {task.module_path!r}: the database refused the new task ({sql.refused_by(error, using)}); "
        "it was not written (on PostgreSQL an enclosing transaction is aborted: roll it back). Every "
        "documented input rule was met, so this is a constraint or trigger added to the table "
        "outside nexus_workflows"
    )


def _unsupported(*values: Any) -> str:
    """What ``normalize_json`` could not convert, by type (never the value)."""
    stack = list(values)
    seen: set[int] = set()  # each container once: shared or circular ones end the walk
    while stack:
        value = stack.pop()
        if isinstance(value, str | bool | int | float) or value is None:
            continue
        if isinstance(value, bytes):
            if not _is_utf8(value):
                return "bytes value that is not UTF-8"
            continue
        if id(value) in seen:
            continue
        if isinstance(value, Mapping):
            seen.add(id(value))
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, Sequence):
            seen.add(id(value))
            stack.extend(value)
        else:
            return f"value of type {type(value).__name__}"
    return "value that is not JSON"


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True

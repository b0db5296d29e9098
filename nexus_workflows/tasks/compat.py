"""Django's Tasks API from where this Django has it: ``django.tasks`` (Django 6.0 and later)
or the ``django-tasks`` backport (Django 5.2), under the same names.

The backport names two exceptions differently (``InvalidTaskError``,
``InvalidTaskBackendError``); they are imported here as Django's names.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING


class _NoEmptyExceptionInfo(logging.Filter):
    """The backport logs a failed task with ``logger.exception()``. The runner sends
    ``task_finished`` after the outcome is written, outside any exception handler, so
    that record's exception info is empty and would print as "NoneType: None". Django
    6's own receiver passes none when there is none; this does the same for the backport."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[0] is None:
            record.exc_info = None
        return True


if TYPE_CHECKING:
    # The type check runs on the pinned set, Django 5.2 with the backport: django-stubs 5.2
    # has no django.tasks. The names are the same either way.
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    SOURCE: str
else:
    try:
        from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task, TaskError
        from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started
        from django.utils.json import normalize_json

        SOURCE = "django.tasks"
    except ModuleNotFoundError:  # Django 5.2: the backport
        from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import (
            TASK_MAX_PRIORITY,
            TASK_MIN_PRIORITY,
            Task,
            TaskError,
        )
        from django_tasks.exceptions import (
            InvalidTaskBackendError as InvalidTaskBackend,
        )
        from django_tasks.exceptions import (
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        logging.getLogger("django_tasks").addFilter(_NoEmptyExceptionInfo())

        SOURCE = "django_tasks"

__all__ = [
    "SOURCE",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

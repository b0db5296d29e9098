"""Django tasks (the public ``@task`` API only) that the tests enqueue and that runner
processes started by the tests import by path."""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path
from typing import Any

try:
    from django.tasks import task
except ModuleNotFoundError:  # Django 5.2: the backport
    from django_tasks import task

from nexus_workflows import PermanentError
from tests.testapp.models import Ledger

# Minutes: a retry 0.6 s later.
RETRY = [0.01, 0.01]
# Django 6.1 and the backport pass extra @task keywords to the backend's task_class; Django
# 6.0 does not, so there a task gets its retries from a backend's OPTIONS (the "retrying"
# backend of tests/settings.py retries along RETRY too).
TASK_OPTIONS = "kwargs" in inspect.signature(task).parameters
RETRYING: dict[str, Any] = {"retry_schedule": RETRY} if TASK_OPTIONS else {"backend": "retrying"}


def _record(name: str, key: str, step: str = "done") -> None:
    Ledger.objects.create(kind=name, key=key, step=step, pid=os.getpid())


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
def record(key: str) -> str:
    _record("record", key)
    return key


@task()
def explode(key: str) -> None:
    _record("explode", key)
    raise ValueError("the upstream said no")


@task()
def keyed_by_numbers(key: str) -> dict[Any, Any]:
    """A value JSON gives back otherwise: integer keys come back as strings."""
    return {1: key, "pair": (2, 3)}


#: A statement every database reads and refuses as an OperationalError (DB-API's class for
#: outages too): a program limit on PostgreSQL, a missing table on SQLite, an unknown
#: column on MariaDB.
BAD_QUERY = {
    "postgresql": "SELECT array_fill(0, ARRAY[200000000])",
    "sqlite": "SELECT * FROM nw_no_such_table",
    "mysql": "SELECT nw_no_such_column FROM nexus_workflows_deferredwork",
}


@task()
def queries_badly(key: str) -> None:
    from django.db import connection

    _record("queries_badly", key)
    with connection.cursor() as cursor:
        cursor.execute(BAD_QUERY[connection.vendor])


@task(takes_context=True, **RETRYING)
def flaky(context: Any, key: str, failures: int) -> dict[str, Any]:
    """Fails its first ``failures`` attempts; retried along RETRY (a task option)."""
    _record("flaky", key, f"attempt {context.attempt}")
    if context.attempt <= failures:
        raise ConnectionError(f"attempt {context.attempt} failed")
    return {"attempt": context.attempt, "result_id": context.task_result.id}


@task(takes_context=True, **RETRYING)
def recalls_errors(context: Any, key: str, failures: int) -> list[str]:
    """Like ``flaky``; records how many errors its TaskResult shows at each attempt."""
    _record("recalls_errors", key, f"attempt {context.attempt}: {len(context.task_result.errors)} errors")
    if context.attempt <= failures:
        raise ConnectionError(f"attempt {context.attempt} failed")
    return [error.exception_class_path for error in context.task_result.errors]


@task(**RETRYING)
def refuses(key: str) -> None:
    """Raises a permanent error: abandoned at once although it has retries."""
    _record("refuses", key)
    raise PermanentError("the template was rejected")


@task(backend="retrying", takes_context=True)
def flaky_by_options(context: Any, key: str, failures: int) -> int:
    """Retried along the ``retrying`` backend's OPTIONS["RETRY_SCHEDULE"]."""
    _record("flaky_by_options", key, f"attempt {context.attempt}")
    if context.attempt <= failures:
        raise ConnectionError("not yet")
    return context.attempt


@task()
async def double(value: int) -> int:
    return value * 2


@task()
def returns_a_set(key: str) -> Any:
    return {1, 2}


# Text that jsonb cannot store (a lone surrogate, a NUL), built inside the task: arguments
# like these are refused at enqueue. "escaped nul" is a backslash and "u0000": storable.
UNSTORABLE = {
    "lone surrogate": "María López \ud800",
    "nul": "María López\x00",
    "surrogate key": {"María López \ud800": 1},
    "escaped nul": "C:\\u0000\\dir",
}


@task()
def returns_nested(depth: int) -> Any:
    """A list nested ``depth`` lists deep."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@task()
def returns_text(which: str) -> Any:
    return UNSTORABLE[which]


@task()
def fails_with_text(which: str) -> None:
    raise ValueError(f"could not reach {UNSTORABLE[which]}")


@task(takes_context=True, **RETRYING)
def hold(context: Any, key: str, release_file: str) -> int:
    """Records its start, then waits until ``release_file`` exists (a runner may be killed
    meanwhile)."""
    _record("hold", key, f"attempt {context.attempt}")
    deadline = time.monotonic() + 60
    while not Path(release_file).exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return context.attempt


@task()
def hold_once(key: str, release_file: str) -> None:
    """Like ``hold`` but without retries: a task runs once unless asked otherwise."""
    _record("hold_once", key)
    deadline = time.monotonic() + 60
    while not Path(release_file).exists() and time.monotonic() < deadline:
        time.sleep(0.02)

"""The benchmark's ``@task`` functions, one module for every Tasks backend measured:
django-tasks-db's ``DatabaseBackend`` (peers' virtualenv, Django 5.2 with the django-tasks
backport) and ours (``nexus_workflows.tasks.DeferredBackend``, the app's ``.venv``).
Plain (sync) functions, like ``prepare`` of our workflows."""

from __future__ import annotations

import time

try:
    from django.tasks import task
except ModuleNotFoundError:  # Django 5.2: the backport
    from django_tasks import task


@task()
def noop(key: str) -> None:
    """Does nothing: the benchmark measures the machinery around it."""


@task()
def stamp(key: str) -> float:
    """Returns the moment it started (stored as the task's return value)."""
    return time.time()

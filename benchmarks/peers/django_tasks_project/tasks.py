"""The benchmark's tasks: plain (sync) functions, like ``prepare`` of ours."""

from __future__ import annotations

import time

from django_tasks import task


@task()
def noop(key: str) -> None:
    """Does nothing: the benchmark measures the machinery around it."""


@task()
def stamp(key: str) -> float:
    """Returns the moment it started (stored as the task's return value)."""
    return time.time()

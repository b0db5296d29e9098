"""Shared fixtures. Tests talk to the real database (SQLite or PostgreSQL, by
DATABASE_URL) and, where marked, the real Redis; nothing is mocked."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection

from nexus_workflows.registry import Workflow, registry

IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``postgresql`` are deselected (not skipped) on the SQLite leg."""
    from django.conf import settings

    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        return
    selected, deselected = [], []
    for item in items:
        (deselected if item.get_closest_marker("postgresql") else selected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


_kind_numbers = itertools.count(1)


@pytest.fixture
def register_workflow() -> Iterator[Callable[..., Workflow]]:
    """Register workflows for one test under unique kinds; unregistered afterwards."""
    registered: list[str] = []

    def register(
        prepare: Callable[..., Any],
        *,
        kind: str | None = None,
        dedupe_key: Callable[[Any], str] | None = None,
        retry_schedule: list[float] | None = None,
    ) -> Workflow:
        kind = kind or f"t{next(_kind_numbers)}-" + re.sub(r"[^A-Za-z0-9]+", "-", prepare.__name__).strip("-")
        workflow = registry.register(
            kind,
            dedupe_key=dedupe_key or (lambda trigger: str(trigger["key"])),
            prepare=prepare,
            retry_schedule=retry_schedule,
        )
        registered.append(kind)
        return workflow

    yield register
    for kind in registered:
        registry.unregister(kind)


@pytest.fixture
def is_postgresql() -> bool:
    return connection.vendor == "postgresql"

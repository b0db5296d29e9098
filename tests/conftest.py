"""Shared fixtures. Tests talk to the real database (SQLite or PostgreSQL, by
DATABASE_URL) and, where marked, the real Redis; nothing is mocked."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
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
        **flow: Any,
    ) -> Workflow:
        kind = kind or f"t{next(_kind_numbers)}-" + re.sub(r"[^A-Za-z0-9]+", "-", prepare.__name__).strip("-")
        workflow = registry.register(
            kind,
            dedupe_key=dedupe_key or (lambda trigger: str(trigger["key"])),
            prepare=prepare,
            retry_schedule=retry_schedule,
            **flow,
        )
        registered.append(kind)
        return workflow

    yield register
    for kind in registered:
        registry.unregister(kind)


@pytest.fixture
def is_postgresql() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def rq_redis() -> Iterator[redis.Redis]:
    """The Redis database fire-and-forget tests use (REDIS_TEST_URL), empty before and
    after the test. Unreachable: a failure in CI, a skip elsewhere."""
    from django.conf import settings

    url = settings.REDIS_TEST_URL
    if not url:
        pytest.fail("REDIS_TEST_URL is empty (embedded mode); these tests need a Redis server")
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as error:
        kwargs = client.connection_pool.connection_kwargs
        message = (
            f"Redis is not reachable at {kwargs.get('host')}:{kwargs.get('port')} (REDIS_TEST_URL): {error}"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    client.flushdb()  # only this test database, never FLUSHALL
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def rq_burst(rq_redis: redis.Redis) -> Callable[..., int]:
    """Run an in-process RQ SimpleWorker in burst mode; returns the jobs it ran.

    In-process, so it sees workflows registered with ``register_workflow``.
    """
    from rq import SimpleWorker

    from nexus_workflows.fire_and_forget import get_queue

    class CountingWorker(SimpleWorker):
        jobs_run = 0

        def execute_job(self, job: Any, queue: Any) -> Any:
            self.jobs_run += 1
            return super().execute_job(job, queue)

    def burst(*queue_names: str, with_scheduler: bool = False) -> int:
        queues = [get_queue(name) for name in queue_names or ("default",)]
        worker = CountingWorker(queues, connection=queues[0].connection)
        # The worker installs its own SIGINT/SIGTERM handlers; give pytest its own back.
        handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            worker.work(burst=True, with_scheduler=with_scheduler, logging_level="WARNING")
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)
        return worker.jobs_run

    return burst


def database_url(settings_dict: dict[str, Any]) -> str:
    """A DATABASE_URL for the database a connection uses (during tests: the test database)."""
    if settings_dict["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{Path(settings_dict['NAME']).resolve()}"
    user = quote(settings_dict.get("USER") or "", safe="")
    password = quote(settings_dict.get("PASSWORD") or "", safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{credentials}{host}:{port}/{settings_dict['NAME']}"


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for a ``manage.py`` subprocess that shares this test's database,
    test Redis and NEXUS_WORKFLOWS settings (and never a REDIS_URL from outside)."""
    from django.conf import settings

    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_TEST_URL": settings.REDIS_TEST_URL,
            "NEXUS_WORKFLOWS_JSON": json.dumps(settings.NEXUS_WORKFLOWS),
            "PYTHONPATH": str(REPOSITORY),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


REPOSITORY = Path(__file__).resolve().parent.parent
PYTHON = sys.executable

"""Fixtures of the fault suite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from tests.faults.partitions import Partitions, require_namespaces
from tests.faults.servers import PrivatePostgres, PrivateRedis


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of this test's own (initdb into a temporary directory, its own
    port), stopped and removed afterwards."""
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def private_redis_client(settings: Any) -> Iterator[redis.Redis]:
    """A client of a redis-server of this test's own (its own port, killed by PID
    afterwards), which the project's "default" RQ queue uses for the test."""
    server = PrivateRedis()
    try:
        server.start()
        settings.RQ_QUEUES = {"default": {"URL": server.url, "DEFAULT_TIMEOUT": 60}}
        client = redis.Redis.from_url(server.url)
        yield client
        client.close()
    finally:
        server.cleanup()


@pytest.fixture
def partitions() -> Iterator[Partitions]:
    """A network namespace of this test's own, two paths to it from the host and a
    virtual IP (see :mod:`tests.faults.partitions`); deleted afterwards, whatever
    happened. Without root: a failure in CI, a skip elsewhere."""
    require_namespaces()
    made = Partitions()
    try:
        made.create()
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def partitioned_postgres(partitions: Partitions) -> Iterator[PrivatePostgres]:
    """A private PostgreSQL cluster running inside ``partitions``' namespace, stopped (by
    its PID) and removed before the namespace goes."""
    server = PrivatePostgres(inside=partitions)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()

"""Fixtures of the fault suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.partitions import Partitions, require_namespaces
from tests.faults.servers import PrivatePostgres


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

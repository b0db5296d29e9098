"""Fixtures of the fault suite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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

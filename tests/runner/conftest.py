"""Fixtures of the runner tests that meet SQLite busy (tests/runner/test_sqlite_busy*.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest
from django.db import connection, connections


@pytest.fixture
def holder() -> Iterator[sqlite3.Connection]:
    """A second connection to the SQLite test database's file, in autocommit until it
    begins (``BEGIN IMMEDIATE`` takes the file's write lock)."""
    held = sqlite3.connect(connection.settings_dict["NAME"], timeout=5, isolation_level=None)
    yield held
    if held.in_transaction:
        held.execute("ROLLBACK")
    held.close()


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's connections wait 0.1 s for the write lock (the project's is 30 s)."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    monkeypatch.setitem(options, "timeout", 0.1)
    connections.close_all()

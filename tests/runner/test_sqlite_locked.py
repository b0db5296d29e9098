"""SQLite's "database table is locked" (``SQLITE_LOCKED``, 6; extended
``SQLITE_LOCKED_SHAREDCACHE``): the database's URI asks for a shared cache
(``file:…?cache=shared``, which Django's backend opens with ``uri=True``), and another
connection of the same process holds a write on the work table. SQLite answers at once
(its ``timeout`` does not wait for this lock), as it answers "busy": a refusal, not an
outage. A real second connection shares the test database's cache."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections

from nexus_workflows import enqueue
from nexus_workflows.database_errors import is_database_unavailable, sqlite_result_code, statement_refused
from nexus_workflows.models import DeferredWork
from tests.conftest import work_table
from tests.runner.refusals import messages, run_through_refused_turns

#: SQLite's primary result code (sqlite3.h), spelt out: the test is of the error SQLite gave.
SQLITE_LOCKED = 6

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


@pytest.fixture
def shared_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every Django connection to the test database shares one cache per process; yields
    the URI, for a second connection of the test's own to share it too."""
    uri = f"file:{Path(connection.settings_dict['NAME']).resolve()}?cache=shared"
    connections.close_all()
    monkeypatch.setitem(connection.settings_dict, "NAME", uri)
    yield uri
    connections.close_all()  # before the plain file name comes back


@pytest.fixture
def table_holder(shared_cache: str) -> Iterator[sqlite3.Connection]:
    """A connection in the shared cache, in autocommit until it begins."""
    held = sqlite3.connect(shared_cache, uri=True, timeout=5, isolation_level=None)
    yield held
    if held.in_transaction:
        held.execute("ROLLBACK")
    held.close()


def hold_the_work_table(holder: sqlite3.Connection) -> None:
    holder.execute("BEGIN IMMEDIATE")
    holder.execute(f"UPDATE {work_table()} SET attempt = attempt WHERE id < 0")


def test_a_table_locked_in_the_shared_cache_is_a_refusal_not_an_outage(table_holder: Any) -> None:
    """On the old code: an outage (``is_database_unavailable``), no refusal."""
    hold_the_work_table(table_holder)
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the driver's error, whatever its class
        DeferredWork.objects.update(attempt=0)
    assert type(raised.value).__name__ == "OperationalError"
    assert raised.value.__cause__.sqlite_errorcode & 0xFF == SQLITE_LOCKED
    assert not is_database_unavailable(raised.value)
    assert "SQLite locked" in (statement_refused(raised.value) or "")


def test_the_runner_waits_out_a_table_locked_in_the_shared_cache_without_an_outage(
    register_workflow: Any, table_holder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """On the old code each turn was an outage: "database unavailable (OperationalError)",
    a growing back-off and the outage metric."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    hold_the_work_table(table_holder)
    runner = run_through_refused_turns(kind, work_id, lambda: table_holder.execute("ROLLBACK"), caplog)
    assert not messages(caplog, "database unavailable")
    refused = messages(caplog, "of the runner's turn did not pass (")
    assert len(refused) == 1, refused
    assert "SQLite locked" in refused[0]
    assert runner.stats.done == 1


def drop_while_handling_another_error(holder: sqlite3.Connection) -> None:
    try:
        raise KeyError("unrelated")
    except KeyError:
        holder.execute("DROP TABLE t")  # "database table is locked": SQLITE_LOCKED


def test_a_drivers_own_error_raised_while_another_was_handled_is_read_itself() -> None:
    """The old code read the error's context first: a raw ``sqlite3`` error raised while
    handling another exception was not recognised as busy or locked."""
    holder = sqlite3.connect(":memory:", isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("INSERT INTO t VALUES (1), (2)")
    reader = holder.execute("SELECT x FROM t")
    reader.fetchone()  # a statement still reading the table
    try:
        with pytest.raises(sqlite3.OperationalError) as raised:
            drop_while_handling_another_error(holder)
    finally:
        reader.close()
        holder.close()
    assert isinstance(raised.value.__context__, KeyError)
    assert sqlite_result_code(raised.value) == SQLITE_LOCKED
    assert "SQLite locked" in (statement_refused(raised.value) or "")

"""A heartbeat (or a start mark) the database ends to break a deadlock is written again at
once, not counted a failed beat: a journal batch updates the same rows, many in one
statement, in the order of its own plan. Before, the beat failed with a WARNING
("heartbeat failed (OperationalError)"), and the next beat, an interval later, passed.

The deadlock is made on purpose, as for the journal (tests/runner/test_journal_conflicts.py):
another session holds the second row, the heartbeat's statement takes the first and waits,
then that session updates the first row too. Its own ``deadlock_timeout`` is long, so the
heartbeat's session is the one PostgreSQL ends (after its default second)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from nexus_workflows.deferred.runner.heartbeat import Heartbeat
from nexus_workflows.deferred.runner.ledger import SYNC, Ledger
from nexus_workflows.models import DeferredWork
from tests.processes import wait_for
from tests.raw_connections import raw_connection
from tests.runner.test_journal_conflicts import TABLE, claimed_pair, lock_waits

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]


def beat(heartbeat: Heartbeat) -> None:
    heartbeat._turn(0.0)  # a beat is due; no start mark is wanted


def mark(heartbeat: Heartbeat) -> None:
    heartbeat.ledger.take_now(SYNC, 2)  # both started: their marks are wanted
    heartbeat._mark_started()


@pytest.mark.parametrize(
    ("statement", "column", "logged"),
    [
        (beat, "heartbeat_at", "a heartbeat was not written (the database ended it to break a deadlock)"),
        (mark, "started_at", "start marks were not written (the database ended it to break a deadlock)"),
    ],
)
def test_a_heartbeat_statement_ended_by_a_deadlock_is_written_again(
    register_workflow: Any,
    caplog: pytest.LogCaptureFixture,
    statement: Callable[[Heartbeat], None],
    column: str,
    logged: str,
) -> None:
    first, second = claimed_pair(register_workflow)
    DeferredWork.objects.update(heartbeat_at=None, started_at=None)
    ledger = Ledger()
    ledger.dispatch([first, second])
    heartbeat = Heartbeat(ledger, using="default", interval=60, stale_after=300, on_beat=lambda: None)
    backend: dict[str, int] = {}
    raised: list[BaseException] = []

    def run() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                backend["pid"] = cursor.fetchone()[0]
            statement(heartbeat)
        except BaseException as error:  # noqa: BLE001 - checked below
            raised.append(error)
        finally:
            connection.close()

    with raw_connection() as journal, caplog.at_level(logging.INFO, logger="nexus_workflows"):
        journal.execute("SET deadlock_timeout = '30s'")  # the heartbeat's session detects it
        journal.execute("BEGIN")
        journal.execute(f"UPDATE {TABLE} SET checkpoints = '{{}}' WHERE id = %s", [second.id])
        thread = threading.Thread(target=run)
        thread.start()
        what = "the heartbeat's statement to wait"
        wait_for(lambda: "pid" in backend and lock_waits(backend["pid"]), timeout=10, what=what)
        # The statement holds the first row and waits for the second: this closes the cycle.
        journal.execute(f"UPDATE {TABLE} SET checkpoints = '{{}}' WHERE id = %s", [first.id])
        journal.execute("COMMIT")
        thread.join(30)
    assert not thread.is_alive()
    assert raised == []
    assert logged in caplog.text
    assert "heartbeat failed" not in caplog.text
    written = DeferredWork.objects.filter(pk__in=[first.id, second.id]).values_list(column, flat=True)
    assert None not in list(written)

"""SQLite's "database is locked": another connection held the file's write lock longer
than the runner's ``timeout``. The database answered "busy", as a server's lock wait cut
short does: no outage (no back-off, no outage line), said once while it lasts, and the
work runs as soon as the lock goes. A real second connection holds ``BEGIN IMMEDIATE`` on
the test database's file."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from nexus_workflows import enqueue
from nexus_workflows.database_errors import is_database_unavailable, statement_refused
from nexus_workflows.models import DeferredWork
from tests.runner.refusals import messages, run_through_refused_turns

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]


def test_database_is_locked_is_a_refusal_not_an_outage(holder: Any, short_timeout: None) -> None:
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the driver's error, whatever its class
        DeferredWork.objects.update(attempt=0)
    assert type(raised.value).__name__ == "OperationalError"
    assert not is_database_unavailable(raised.value)
    assert "SQLite busy" in (statement_refused(raised.value) or "")


def test_the_runner_waits_out_a_held_write_lock_without_an_outage(
    register_workflow: Any, holder: Any, short_timeout: None, caplog: pytest.LogCaptureFixture
) -> None:
    """On the old code each turn was an outage: "database unavailable (OperationalError)",
    a growing back-off (up to 10 s) and the outage metric."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    work_id = enqueue(kind, {"key": "a"})
    holder.execute("BEGIN IMMEDIATE")
    run_through_refused_turns(kind, work_id, lambda: holder.execute("ROLLBACK"), caplog)
    assert not messages(caplog, "database unavailable")
    refused = messages(caplog, "of the runner's turn did not pass (", logging.WARNING)
    assert len(refused) == 1, refused
    assert "SQLite busy" in refused[0]

"""SQLite's "database is locked": another connection held the file's write lock longer
than the runner's ``timeout``. The database answered "busy", as a server's lock wait cut
short does: no outage (no back-off, no outage line), said once while it lasts, and the
work runs as soon as the lock goes. A real second connection holds ``BEGIN IMMEDIATE`` on
the test database's file."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from nexus_workflows import enqueue
from nexus_workflows.database_errors import is_database_unavailable, statement_refused
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.models import DeferredWork, Status
from tests.processes import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]

SETTINGS = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.2, "STALE_AFTER": 30, "SHUTDOWN_GRACE": 2}


def messages(caplog: pytest.LogCaptureFixture, text: str, level: int | None = None) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if text in record.getMessage() and (level is None or record.levelno == level)
    ]


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
    logged = caplog.at_level(logging.DEBUG, logger="nexus_workflows")
    with override_settings(NEXUS_WORKFLOWS=SETTINGS), logged:
        runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            # Three turns refused (the old code's outage is said at its first turn).
            wait_for(
                lambda: (
                    len(messages(caplog, "did not pass again")) >= 3
                    or bool(messages(caplog, "database unavailable"))
                ),
                timeout=30,
                what="three turns refused",
            )
            holder.execute("ROLLBACK")
            wait_for(
                lambda: DeferredWork.objects.get(pk=work_id).status == Status.DONE,
                timeout=30,
                what="the work to run once the lock went",
            )
        finally:
            runner.request_stop()
            thread.join(30)
            connections.close_all()
    assert not thread.is_alive()
    assert not messages(caplog, "database unavailable")
    refused = messages(caplog, "of the runner's turn did not pass (", logging.WARNING)
    assert len(refused) == 1, refused
    assert "SQLite busy" in refused[0]

"""The runner's own row while SQLite is busy: another connection holds ``BEGIN IMMEDIATE``
on the test database's file as the runner starts, so its row cannot be written and the
heartbeat tries again every interval. Said once (WARNING) while it lasts, then at DEBUG;
the row is written once the lock goes."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from django.db import connections
from django.test import override_settings

from nexus_workflows.deferred.runner import Runner
from nexus_workflows.observability.models import Runner as RunnerRow
from tests.processes import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.sqlite]

SETTINGS = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.1, "STALE_AFTER": 30, "SHUTDOWN_GRACE": 2}
TEXT = "could not write this runner's row"


def said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if TEXT in r.getMessage() and r.levelno == level]


def test_a_runner_row_not_written_while_sqlite_is_busy_is_said_once(
    register_workflow: Any, holder: Any, short_timeout: None, caplog: pytest.LogCaptureFixture
) -> None:
    """On the old code each heartbeat's try was a WARNING."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    holder.execute("BEGIN IMMEDIATE")
    logged = caplog.at_level(logging.DEBUG, logger="nexus_workflows")
    with override_settings(NEXUS_WORKFLOWS=SETTINGS), logged:
        runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            wait_for(
                lambda: len(said(caplog, logging.DEBUG)) + len(said(caplog, logging.WARNING)) >= 4,
                timeout=30,
                what="four tries to write the runner's row",
            )
            holder.execute("ROLLBACK")
            wait_for(lambda: RunnerRow.objects.exists(), timeout=30, what="the row")
        finally:
            runner.request_stop()
            thread.join(30)
            connections.close_all()
    assert not thread.is_alive()
    warned = said(caplog, logging.WARNING)
    assert len(warned) == 1, warned
    assert "OperationalError" in warned[0]
    assert len(said(caplog, logging.DEBUG)) >= 3

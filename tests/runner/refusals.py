"""A runner run through turns SQLite refuses (tests/runner/test_sqlite_busy.py, busy;
tests/runner/test_sqlite_locked.py, a table locked in a shared cache): the same protocol,
another lock."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
from django.db import connections
from django.test import override_settings

from nexus_workflows.deferred.runner import Runner
from nexus_workflows.models import DeferredWork, Status
from tests.processes import wait_for

SETTINGS = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.2, "STALE_AFTER": 30, "SHUTDOWN_GRACE": 2}


def messages(caplog: pytest.LogCaptureFixture, text: str, level: int | None = None) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if text in record.getMessage() and (level is None or record.levelno == level)
    ]


def run_through_refused_turns(
    kind: str, work_id: str, release: Callable[[], None], caplog: pytest.LogCaptureFixture
) -> Runner:
    """Run a runner of ``kind`` while the lock is held until three of its turns are refused
    (or, on the old code, an outage is said at the first), ``release`` the lock, and wait
    for ``work_id`` to be done; the stopped runner."""
    logged = caplog.at_level(logging.DEBUG, logger="nexus_workflows")
    with override_settings(NEXUS_WORKFLOWS=SETTINGS), logged:
        runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            wait_for(
                lambda: (
                    len(messages(caplog, "did not pass again")) >= 3
                    or bool(messages(caplog, "database unavailable"))
                ),
                timeout=30,
                what="three turns refused",
            )
            release()
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
    return runner

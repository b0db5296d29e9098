"""A runner whose start fails half-way, after its helper threads started (here: the
project's log file cannot be opened, so the start line raises): every part it started is
stopped again and the error goes up. Before, the heartbeat, workers, journal writers,
listener and metrics endpoint went on in the process, and the runner's row stayed, alive.

A real runner on the real database; the failure is a stock ``FileHandler`` (``delay``)
whose directory is missing, as a log directory never made or removed is."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from nexus_workflows.deferred.runner import Runner
from nexus_workflows.observability import metrics_server
from nexus_workflows.observability.models import Runner as RunnerRow
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.1, "STALE_AFTER": 30, "SHUTDOWN_GRACE": 1}


@pytest.fixture
def metrics_servers(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The metrics endpoints' servers started meanwhile (the real ones, kept for a look)."""
    started: list[Any] = []
    serve = metrics_server.serve

    def serve_and_keep(*args: Any, **kwargs: Any) -> Any:
        started.append(serve(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(metrics_server, "serve", serve_and_keep)
    return started


@pytest.fixture
def log_file_unopenable(tmp_path: Path) -> Iterator[None]:
    """The runner's logger writes to a file in a directory that does not exist."""
    handler = logging.FileHandler(tmp_path / "gone" / "runner.log", delay=True)
    runner_logger = logging.getLogger("nexus_workflows.deferred.runner")
    runner_logger.addHandler(handler)
    try:
        yield
    finally:
        runner_logger.removeHandler(handler)


def test_a_start_that_fails_after_the_helpers_started_stops_them_all(
    register_workflow: Callable[..., Any], log_file_unopenable: None, metrics_servers: list[Any]
) -> None:
    kind = register_workflow(lambda trigger, context, step: None, retry_schedule=[1]).kind
    before = set(threading.enumerate())
    handler_before = signal.getsignal(signal.SIGTERM)
    with override_settings(NEXUS_WORKFLOWS=SETTINGS):
        # Port 0: no port picked beforehand that another process could take meanwhile.
        runner = Runner(kinds=[kind], concurrency=2, metrics_port=0)
        with pytest.raises(FileNotFoundError):
            runner.run()

    def started_threads() -> list[str]:
        alive = [thread for thread in threading.enumerate() if thread not in before]
        return [thread.name for thread in alive if thread.name.startswith("nexus-workflows")]

    wait_for(lambda: not started_threads(), timeout=10, what="the runner's threads to end")
    # Its listening socket closed (not a look at the port: another process may take it).
    (endpoint,) = metrics_servers
    assert endpoint.socket.fileno() == -1, "the metrics endpoint still listens"
    assert not RunnerRow.objects.exists(), "the runner's row stayed"
    assert signal.getsignal(signal.SIGTERM) is handler_before

"""``runworkflows`` logs: readable on stderr in a project without logging of its own, and
left to the project's ``LOGGING`` when it has one."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from nexus_workflows import __version__, enqueue
from nexus_workflows.models import DeferredWork
from nexus_workflows.observability.logs import install_default_handler, project_handles_logging
from tests.processes import PROJECT_ROOT, url_of_test_database

pytestmark = pytest.mark.django_db(transaction=True)


def run_command(settings_module: str, *args: str) -> subprocess.CompletedProcess[str]:
    import json
    import os

    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": settings_module,
        "DATABASE_URL": url_of_test_database(),
        "NEXUS_WORKFLOWS_JSON": json.dumps({"POLL_INTERVAL": 0.1}),
    }
    return subprocess.run(
        [sys.executable, "manage.py", "runworkflows", *args],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def enqueue_three() -> dict[str, int]:
    ids = {}
    for outcome in ("done", "retry once", "permanent"):
        ids[outcome] = int(enqueue("test-outcomes", {"key": outcome, "outcome": outcome, "name": "María"}))
    return ids


@pytest.mark.slow
def test_without_logging_settings_the_start_line_and_each_state_change_go_to_stderr() -> None:
    ids = enqueue_three()
    result = run_command("tests.settings_without_logging", "--once", "--kind", "test-outcomes")
    lines = result.stderr.splitlines()
    start = [line for line in lines if "runner started:" in line]
    assert len(start) == 1, result.stderr
    assert f"nexus_workflows {__version__}; database " in start[0]
    assert "; kinds test-outcomes; concurrency 4; wake-ups: poll (polling every 0.1s); once" in start[0]
    assert " INFO " in start[0]
    for expected in (
        f"test-outcomes #{ids['done']} attempt 1 of 4: done",
        f"test-outcomes #{ids['retry once']} attempt 1 of 4: failed (ConnectionError); "
        "attempt 2 of 4 in 0.6s",
        f"test-outcomes #{ids['permanent']} attempt 1 of 4: failed (PermanentError); "
        "abandoned: permanent error",
        "runner stopped: 1 done, 1 rescheduled, 1 abandoned",
    ):
        assert sum(expected in line for line in lines) == 1, (expected, result.stderr)
    assert "María" not in result.stderr
    assert result.stdout.strip().startswith("runworkflows --once: 1 done, 1 rescheduled, 1 abandoned")


@pytest.mark.slow
def test_with_the_projects_logging_the_command_adds_no_handler_of_its_own() -> None:
    ids = enqueue_three()
    result = run_command("tests.settings", "--once", "--kind", "test-outcomes")
    # The project's formatter names the logger; ours does not. Each line comes once.
    done = [line for line in result.stderr.splitlines() if f"#{ids['done']} attempt 1 of 4: done" in line]
    assert len(done) == 1, result.stderr
    assert " nexus_workflows.deferred.runner " in done[0]
    assert DeferredWork.objects.filter(pk=ids["done"], status="done").exists()


@pytest.fixture
def isolated_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("nexus_workflows_logs_test")
    yield logger
    logger.handlers.clear()
    logger.propagate = True


def test_handlers_count_where_records_would_reach_them(isolated_logger: logging.Logger, caplog: Any) -> None:
    # pytest's capture handler sits on the root logger: records propagate to it.
    assert project_handles_logging(isolated_logger)
    isolated_logger.propagate = False
    assert not project_handles_logging(isolated_logger)  # lastResort does not count
    isolated_logger.addHandler(logging.NullHandler())
    assert project_handles_logging(isolated_logger)


def test_in_a_process_whose_root_logger_has_a_handler_nothing_is_installed(caplog: Any) -> None:
    assert logging.getLogger().handlers  # pytest's
    assert install_default_handler() is None

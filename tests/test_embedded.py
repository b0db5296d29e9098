"""The embedded mode: fire-and-forget workflows through RQ on an in-process fakeredis.

In-process tests point RQ_QUEUES at the embedded server; the subprocess tests prove that
a project with no REDIS_URL runs a workflow without any Redis server (or network).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import transaction
from rq.job import JobStatus
from rq.registry import FailedJobRegistry

from nexus_workflows import enqueue
from nexus_workflows.fire_and_forget import embedded as embedded_module
from nexus_workflows.fire_and_forget import get_queue
from nexus_workflows.fire_and_forget.embedded import (
    embedded_queue,
    embedded_server,
    is_embedded,
    warn_if_embedded,
)
from nexus_workflows.fire_and_forget.sealing import open_error
from tests.conftest import PYTHON, REPOSITORY
from tests.testapp.models import Ledger


@pytest.fixture
def embedded(settings: Any) -> Iterator[redis.Redis]:
    """RQ_QUEUES on the in-process server, emptied before and after the test (it lives as
    long as the process)."""
    settings.RQ_QUEUES = {"default": embedded_queue(DEFAULT_TIMEOUT=60)}
    connection = get_queue("default").connection
    connection.flushdb()
    yield connection
    connection.flushdb()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    logger = logging.getLogger("nexus_workflows")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def test_embedded_queue_is_synchronous_on_the_one_in_process_server() -> None:
    config = embedded_queue(DEFAULT_TIMEOUT=30, ASYNC=True)
    assert config["ASYNC"] is False  # no worker could see the server
    assert config["DEFAULT_TIMEOUT"] == 30
    assert is_embedded(config)
    assert not is_embedded({"URL": "redis://127.0.0.1:6379/0"})
    assert not is_embedded(None)
    assert config["REDIS_CLIENT_KWARGS"]["connection_pool"].connection_kwargs["server"] is embedded_server()


def test_the_warning_is_given_once_per_queue_and_only_in_embedded_mode(
    settings: Any, logs: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded_module, "_warned_queues", set())
    assert warn_if_embedded() is False  # the test settings use the real Redis
    assert logs.text == ""
    settings.RQ_QUEUES = {"default": embedded_queue()}
    assert warn_if_embedded() is True
    assert warn_if_embedded("default") is True
    assert (
        logs.text.count("fire-and-forget workflows run synchronously at enqueue on an in-process Redis") == 1
    )


@pytest.mark.django_db(transaction=True)
def test_enqueue_runs_prepare_at_once_through_rq_and_dedupes(embedded: redis.Redis, settings: Any) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 600}
    job_id = enqueue("test-ff-ledger", {"key": "e1"})

    assert job_id == "test-ff-ledger__e1"
    assert Ledger.objects.filter(kind="test-ff-ledger", key="e1", pid=os.getpid()).count() == 1
    job = get_queue("default").fetch_job(job_id)
    assert job.get_status() == JobStatus.FINISHED
    assert 0 < embedded.ttl(job.key) <= 600
    # fakeredis runs RQ's Lua script, so `unique` works here too.
    assert enqueue("test-ff-ledger", {"key": "e1"}) is None
    assert Ledger.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_failing_job_is_recorded_as_failed_and_does_not_raise_into_enqueue(embedded: redis.Redis) -> None:
    job_id = enqueue("test-ff-fail", {"key": "e2", "secret": "Ana"})
    queue = get_queue("default")
    assert job_id in FailedJobRegistry(queue=queue).get_job_ids()
    sealed = queue.fetch_job(job_id).meta["sealed_error"]
    assert "Ana" not in sealed
    assert open_error(job_id, sealed) == "UpstreamRejected: upstream rejected the message for Ana"
    assert enqueue("test-ff-fail", {"key": "e2"}) is None
    assert Ledger.objects.filter(kind="test-ff-fail").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_delay_is_ignored_with_a_warning(embedded: redis.Redis, logs: pytest.LogCaptureFixture) -> None:
    assert enqueue("test-ff-ledger", {"key": "e3"}, delay=3600) == "test-ff-ledger__e3"
    assert Ledger.objects.filter(key="e3").count() == 1
    assert "test-ff-ledger job: delay ignored, the embedded queue runs jobs at enqueue" in logs.text


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_the_job_runs_after_commit_and_not_after_rollback(embedded: redis.Redis) -> None:
    with transaction.atomic():
        assert enqueue("test-ff-ledger", {"key": "e4"}) == "test-ff-ledger__e4"
        assert Ledger.objects.count() == 0  # not inside the caller's transaction
    assert Ledger.objects.filter(key="e4").count() == 1

    class Rollback(Exception):
        pass

    def enqueue_then_roll_back() -> None:
        with transaction.atomic():
            enqueue("test-ff-ledger", {"key": "e5"})
            raise Rollback

    with pytest.raises(Rollback):
        enqueue_then_roll_back()
    assert Ledger.objects.filter(key="e5").count() == 0
    assert not embedded.exists(get_queue("default").job_class.key_for("test-ff-ledger__e5"))


# --- no Redis server at all -------------------------------------------------------------------

# Runs a manage.py command with every TCP connection refused: anything that tried to
# reach a Redis (or any) server would fail the command.
WITHOUT_NETWORK = """
import socket, sys
_connect = socket.socket.connect
def refuse(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        raise OSError(f"this process may not open network connections (tried {address!r})")
    return _connect(self, address)
socket.socket.connect = refuse
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", *sys.argv[1:]])
"""


def run_without_network(
    tmp_path: Path, *arguments: str, **environment: str
) -> subprocess.CompletedProcess[str]:
    env = {
        key: value for key, value in os.environ.items() if key not in ("REDIS_URL", "NEXUS_WORKFLOWS_JSON")
    }
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "REDIS_TEST_URL": "",  # the embedded mode
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
            "PYTHONPATH": str(REPOSITORY),
            **environment,
        }
    )
    return subprocess.run(
        [PYTHON, "-c", WITHOUT_NETWORK, *arguments],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_embedded_mode_runs_a_workflow_with_no_redis_server_at_all(tmp_path: Path) -> None:
    prepared = tmp_path / "prepared.txt"
    trigger = json.dumps({"key": "k1", "path": str(prepared)})
    result = run_without_network(tmp_path, "workflows", "enqueue", "test-ff-file", trigger, "--reveal")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "enqueued job test-ff-file__k1"
    text = prepared.read_text()
    assert text.startswith("prepared k1 in process ")
    assert int(text.rsplit(" ", 1)[1]) != os.getpid()
    assert result.stderr.count("embedded mode: queue 'default' is on fakeredis") == 1


@pytest.mark.slow
def test_commands_that_run_no_fire_and_forget_work_say_nothing_of_the_embedded_mode(tmp_path: Path) -> None:
    result = run_without_network(tmp_path, "check")

    assert result.returncode == 0, result.stderr
    assert "embedded mode" not in result.stderr + result.stdout


@pytest.mark.slow
def test_the_no_network_guard_does_stop_a_real_redis_connection(tmp_path: Path) -> None:
    """Proves the previous test's guard has teeth: with a real Redis configured, the
    same command fails at the first connection."""
    prepared = tmp_path / "prepared.txt"
    trigger = json.dumps({"key": "k2", "path": str(prepared)})
    result = run_without_network(
        tmp_path, "workflows", "enqueue", "test-ff-file", trigger, REDIS_TEST_URL="redis://127.0.0.1:6379/14"
    )
    assert result.returncode != 0
    assert "this process may not open network connections" in result.stderr + result.stdout
    assert not prepared.exists()


@pytest.mark.slow
def test_the_project_settings_default_to_the_embedded_mode_and_run_the_demo_workflow(tmp_path: Path) -> None:
    result = run_without_network(
        tmp_path,
        "workflows",
        "enqueue",
        "demo-notify",
        '{"visit": 1}',
        DJANGO_SETTINGS_MODULE="project.settings",
    )
    assert result.returncode == 0, result.stderr
    # The job id carries the dedupe key: printed only with --reveal.
    assert result.stdout.strip() == (
        "enqueued a demo-notify job (--reveal prints its id, which carries the dedupe key)"
    )
    assert "demo-notify: notification sent" in result.stderr

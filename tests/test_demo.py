"""The quickstart's main job: bin/demo seeds demo work, serves the admin and runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.ports import PortTaken, free_port, start_on_a_free_port
from tests.processes import PROJECT_ROOT, wait_for

# Touches no database of the suite's: bin/test runs it once per Django line.
pytestmark = pytest.mark.database_independent

# What bin/demo prints when the admin's port is taken: before it starts (its own check) or
# after (runserver's, when another process took the port in between).
PORT_TAKEN = ("on 127.0.0.1 is in use by another program", "That port is already in use")


def admin_login_page(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/login/", timeout=2) as page:
            return page.status == 200 and b"csrfmiddlewaretoken" in page.read()
    except OSError:
        return False


def serving_demo(tmp_path: Path, port: int, *, run_for: int) -> tuple[subprocess.Popen[bytes], Path]:
    """``bin/demo`` on a database and a log of its own, once its admin answers on ``port``;
    :class:`PortTaken` (the demo stopped) when it says another process has the port."""
    attempt = tmp_path / f"port-{port}"
    attempt.mkdir()
    log = attempt / "demo.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            ["bin/demo", "--run-for", str(run_for), "--port", str(port)],
            cwd=PROJECT_ROOT,
            env=demo_env(attempt),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:

        def answered_or_ended() -> bool:
            text = log.read_text(errors="replace")
            taken = any(words in text for words in PORT_TAKEN)
            return admin_login_page(port) or taken or process.poll() is not None

        wait_for(answered_or_ended, timeout=60, interval=0.3, what="the admin to answer")
        text = log.read_text(errors="replace")
        if any(words in text for words in PORT_TAKEN):
            raise PortTaken(text[-600:])
        assert process.poll() is None, text
    except BaseException:
        process.kill()
        process.wait(10)
        raise
    return process, log


@pytest.mark.slow
def test_bin_demo_runs_succeeds_retries_abandons_and_serves_the_admin(tmp_path: Path) -> None:
    demos: list[tuple[subprocess.Popen[bytes], Path]] = []
    # demo-flaky's retry comes 6 s after its first attempt: room for a start-up slowed by
    # the runserver child (and a busy machine) before the demo stops.
    port = start_on_a_free_port(
        lambda port: demos.append(serving_demo(tmp_path, port, run_for=14)), free_port(), what="bin/demo"
    )
    process, log = demos[-1]
    try:
        assert process.wait(90) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert "demo-greet #1 attempt 1 of 3: done" in text
    assert "demo-flaky #3 attempt 1 of 3: failed (FlakyUpstream); attempt 2 of 3 in 6s" in text
    assert "demo-flaky #3 attempt 2 of 3: done" in text
    assert "demo-doomed #4 attempt 1 of 3: failed (PermanentError); abandoned: permanent error" in text
    assert "demo stopped: 3 done" in text
    # The admin child process was stopped with the demo: its port stops answering.

    def port_closed() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) != 0

    wait_for(port_closed, timeout=10, what="the admin's port to close")


@pytest.mark.slow
@pytest.mark.redis
def test_bin_demo_starts_an_rq_worker_when_redis_url_is_set(tmp_path: Path, rq_redis: Any) -> None:
    # The test Redis database (REDIS_TEST_URL, emptied by rq_redis; unreachable: a failure
    # in CI), never a hard-coded one another process may be using.
    from django.conf import settings

    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "REDIS_URL": settings.REDIS_TEST_URL,
        "PYTHONUNBUFFERED": "1",
    }
    result = subprocess.run(
        ["bin/demo", "--run-for", "8", "--no-server"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "RQ worker started for fire-and-forget workflows." in output
    assert "demo-notify      visit 6: job demo-notify__6" in output
    # The job was queued at enqueue and run by the worker process, not in-process.
    assert "embedded mode" not in output
    assert "demo-notify: notification sent" in output


def demo_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "REDIS_URL": "",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


@pytest.mark.slow
def test_bin_demo_refuses_a_port_another_server_holds_and_says_how_to_choose_one(tmp_path: Path) -> None:
    with socket.socket() as other_server:
        other_server.bind(("127.0.0.1", 0))
        other_server.listen()
        port = other_server.getsockname()[1]
        result = subprocess.run(
            ["bin/demo", "--run-for", "30", "--port", str(port)],
            cwd=PROJECT_ROOT,
            env=demo_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode != 0
    assert f"port {port} on 127.0.0.1 is in use" in result.stderr
    assert "bin/demo --port 8001" in result.stderr
    # Nothing was started or advertised.
    assert "Admin: http://" not in result.stdout
    assert "Running workflows" not in result.stdout


@pytest.mark.slow
def test_bin_demo_shows_why_the_first_admin_user_could_not_be_created(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bin/demo", "--run-for", "1", "--no-server"],
        cwd=PROJECT_ROOT,
        env=demo_env(
            tmp_path, DJANGO_SUPERUSER_PASSWORD="x-demo-pass", DJANGO_SUPERUSER_USERNAME="no spaces!"
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "Enter a valid username" in result.stderr


@pytest.mark.slow
def test_bin_demo_creates_the_first_admin_user_once_and_keeps_it_on_the_next_run(tmp_path: Path) -> None:
    env = demo_env(tmp_path, DJANGO_SUPERUSER_PASSWORD="x-demo-pass")
    runs = [
        subprocess.run(
            ["bin/demo", "--run-for", "1", "--no-server"],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for _ in range(2)
    ]
    assert [run.returncode for run in runs] == [0, 0], runs[1].stderr
    assert "Superuser created successfully." in runs[0].stdout
    assert "bin/demo: user admin exists; not created again" in runs[1].stdout

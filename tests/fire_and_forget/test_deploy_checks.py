"""``manage.py check --deploy``: whether the Redis of the fire-and-forget queue keeps its jobs
(W306 eviction, W307 no persistence, I308 not reached, I309 cannot tell), each against a
``redis-server`` of the test's own (its own port, killed by PID afterwards)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.checks.registry import registry
from django.core.management import call_command

from nexus_workflows.fire_and_forget.checks import PROBE_TIMEOUT, check_rq_redis_keeps_jobs
from nexus_workflows.fire_and_forget.embedded import embedded_queue
from tests.faults.servers import missing
from tests.ports import PortTaken, free_port, read_since, refusing_port, size_of, start_on_a_free_port
from tests.processes import wait_for
from tests.threads import run_together

OURS = ("nexus_workflows.W306", "nexus_workflows.W307", "nexus_workflows.I308", "nexus_workflows.I309")
NO_PERSISTENCE = ("--save", "", "--appendonly", "no")
AOF = ("--save", "", "--appendonly", "yes")
KEEPS = ("--maxmemory-policy", "noeviction", *AOF)
PASSWORD = "s3cret-Redis-pw"


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def texts(messages: list[Any]) -> str:
    return "\n".join(f"{message.msg}\n{message.hint}" for message in messages)


def ours(messages: list[Any]) -> list[Any]:
    """The messages of the deploy check among all of ``run_checks``'s."""
    return [message for message in messages if message.id in OURS]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            # +PONG, or -NOAUTH from a server with a password: either way it listens.
            return sock.recv(16)[:1] in (b"+", b"-")
    except OSError:
        return False


@contextlib.contextmanager
def private_redis(*options: str, ready: str = "Ready to accept connections") -> Iterator[int]:
    """``redis-server`` with ``options`` on a free port of 127.0.0.1 (again on another while
    its log says the port is taken); yields the port, kills the process by its PID after."""
    binary = shutil.which("redis-server")
    if binary is None:
        missing("redis-server")
    directory = Path(tempfile.mkdtemp(prefix="nw-deploy-check-redis-"))
    log = directory / "redis.log"
    started: list[subprocess.Popen[bytes]] = []

    def start(port: int) -> None:
        logged = size_of(log)
        command = [str(binary), *options, "--port", str(port), "--bind", "127.0.0.1"]
        command += ["--dir", str(directory), "--logfile", str(log)]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(process)

        def up() -> bool:
            said = read_since(log, logged)
            if process.poll() is not None:
                if "Address already in use" in said:
                    raise PortTaken(said.strip()[-600:])
                raise AssertionError(f"redis-server exited ({process.returncode}); its log:\n{said}")
            return ready in said and _answers(port)

        wait_for(up, timeout=20, what=f"redis-server on port {port}")

    try:
        yield start_on_a_free_port(start, free_port(), what="the private redis-server")
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def redis_server() -> Iterator[Callable[..., int]]:
    """Start a private ``redis-server`` with the given options; returns its port."""
    with contextlib.ExitStack() as servers:
        yield lambda *options, **kwargs: servers.enter_context(private_redis(*options, **kwargs))


def url(port: int, *, password: str | None = None) -> str:
    return f"redis://{f':{password}@' if password else ''}127.0.0.1:{port}/0"


def on(settings: Any, port: int, **queue: Any) -> None:
    """The workflows' queue ("default") on the server at ``port``."""
    settings.RQ_QUEUES = {"default": {"URL": url(port), **queue}}


# --- eviction (W306) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ("volatile-lru", "exactly the finished and failed jobs"),
        ("volatile-ttl", "exactly the finished and failed jobs"),
        ("allkeys-lru", "queued jobs, which then never run"),
    ],
)
def test_an_evicting_policy_is_a_warning(
    settings: Any, redis_server: Callable[..., int], policy: str, says: str
) -> None:
    on(settings, redis_server("--maxmemory-policy", policy, "--maxmemory", "64mb", *AOF))
    messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == ["nexus_workflows.W306"]
    (warning,) = messages
    assert warning.msg.startswith(
        f"The Redis of queue 'default' (NEXUS_WORKFLOWS['RQ_QUEUE']) has maxmemory-policy {policy}: "
    )
    assert says in warning.msg
    assert "No maxmemory" not in warning.msg
    assert warning.hint.startswith("Set `maxmemory-policy noeviction` on that Redis")


def test_an_evicting_policy_without_maxmemory_says_nothing_is_evicted_yet(
    settings: Any, redis_server: Callable[..., int]
) -> None:
    on(settings, redis_server("--maxmemory-policy", "volatile-lru", *AOF))
    messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == ["nexus_workflows.W306"]
    assert messages[0].msg.endswith("(No maxmemory is set now, so nothing is evicted until one is.)")


def test_noeviction_with_persistence_passes(settings: Any, redis_server: Callable[..., int]) -> None:
    on(settings, redis_server(*KEEPS, "--maxmemory", "64mb"))
    assert check_rq_redis_keeps_jobs() == []


# --- persistence (W307) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("persistence", "expected"),
    [
        (("--save", "", "--appendonly", "no"), ["nexus_workflows.W307"]),
        (("--save", "", "--appendonly", "yes"), []),
        (("--save", "60 1", "--appendonly", "no"), []),
        (("--save", "60 1", "--appendonly", "yes"), []),
    ],
    ids=["aof-off-save-off", "aof-on", "rdb-snapshots", "both"],
)
def test_no_persistence_is_a_warning(
    settings: Any, redis_server: Callable[..., int], persistence: tuple[str, ...], expected: list[str]
) -> None:
    on(settings, redis_server("--maxmemory-policy", "noeviction", *persistence))
    messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == expected
    if expected:
        assert messages[0].msg == (
            "The Redis of queue 'default' (NEXUS_WORKFLOWS['RQ_QUEUE']) has no persistence (AOF off, "
            "no RDB snapshots): a restart forgets every job, queued ones included, and the next "
            "enqueue of a finished job's dedupe key runs `prepare` again."
        )
        assert "`appendonly yes`" in messages[0].hint


def test_both_warnings_at_once(settings: Any, redis_server: Callable[..., int]) -> None:
    on(settings, redis_server("--maxmemory-policy", "allkeys-lfu", *NO_PERSISTENCE))
    assert ids(check_rq_redis_keeps_jobs()) == ["nexus_workflows.W306", "nexus_workflows.W307"]


# --- a server that does not tell (I309) -------------------------------------------------------


def test_config_refused_with_aof_off_cannot_tell(settings: Any, redis_server: Callable[..., int]) -> None:
    """Managed Redis services often disable CONFIG: AOF off then leaves snapshots unknown."""
    on(
        settings,
        redis_server("--maxmemory-policy", "noeviction", *NO_PERSISTENCE, "--rename-command", "CONFIG", ""),
    )
    messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == ["nexus_workflows.I309"]
    assert messages[0].msg == (
        "`check --deploy` cannot tell whether the Redis of queue 'default' (NEXUS_WORKFLOWS['RQ_QUEUE']) "
        "keeps its data across a restart: AOF is off, and CONFIG GET save, which says whether "
        "RDB snapshots are on, it refused (ResponseError)."
    )


def test_config_refused_with_aof_on_is_judged_by_aof(settings: Any, redis_server: Callable[..., int]) -> None:
    on(settings, redis_server(*KEEPS, "--rename-command", "CONFIG", ""))
    assert check_rq_redis_keeps_jobs() == []


def test_info_refused_cannot_tell(settings: Any, redis_server: Callable[..., int]) -> None:
    on(settings, redis_server(*KEEPS, "--rename-command", "INFO", ""))
    messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == ["nexus_workflows.I309"]
    assert "keeps its jobs: it refused INFO (ResponseError)." in messages[0].msg


# --- a server not reached (I308) --------------------------------------------------------------


def test_a_refused_connection_is_an_info_naming_the_queue_and_the_error_type(settings: Any) -> None:
    with refusing_port() as port:
        settings.RQ_QUEUES = {"default": {"URL": url(port, password=PASSWORD)}}
        began = time.monotonic()
        messages = check_rq_redis_keeps_jobs()
        took = time.monotonic() - began
    assert ids(messages) == ["nexus_workflows.I308"]
    assert messages[0].msg == (
        "`check --deploy` could not ask the Redis of queue 'default' (NEXUS_WORKFLOWS['RQ_QUEUE']) "
        "whether it keeps its jobs (ConnectionError; it gives the server 2 s to connect and to each answer)."
    )
    text = texts(messages)
    assert PASSWORD not in text
    assert "127.0.0.1" not in text
    assert str(port) not in text
    assert took < 2


def test_a_server_that_never_answers_is_given_up_within_the_timeout(settings: Any) -> None:
    """Accepted by the kernel (a listening socket no one reads): the check waits
    PROBE_TIMEOUT, not the queue's own timeouts (none here) nor its retries."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        settings.RQ_QUEUES = {
            "default": {
                "HOST": "127.0.0.1",
                "PORT": port,
                "DB": 0,
                "REDIS_CLIENT_KWARGS": {"socket_timeout": None, "socket_connect_timeout": None},
            }
        }
        began = time.monotonic()
        # In a thread, so that a check that waits on fails here (run_together raises) and the
        # socket's close then ends its wait, rather than hanging the test.
        (messages,) = run_together(lambda _: check_rq_redis_keeps_jobs(), 1, timeout=PROBE_TIMEOUT + 3)
        took = time.monotonic() - began
    assert ids(messages) == ["nexus_workflows.I308"]
    assert "(TimeoutError;" in messages[0].msg
    assert PROBE_TIMEOUT <= took < PROBE_TIMEOUT + 2


def test_a_bad_url_is_an_info_without_the_url(settings: Any) -> None:
    settings.RQ_QUEUES = {"default": {"URL": f"http://user:{PASSWORD}@example.invalid/0"}}
    messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == ["nexus_workflows.I308"]
    assert "(ValueError;" in messages[0].msg
    assert PASSWORD not in texts(messages)
    assert "example" not in texts(messages)


def test_passwords_never_show(settings: Any, redis_server: Callable[..., int]) -> None:
    port = redis_server("--requirepass", PASSWORD, "--maxmemory-policy", "volatile-lru", *AOF)
    settings.RQ_QUEUES = {"default": {"URL": url(port, password=PASSWORD)}}
    messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == ["nexus_workflows.W306"]  # the password lets it in
    assert PASSWORD not in texts(messages)
    settings.RQ_QUEUES = {"default": {"URL": url(port, password=PASSWORD + "-wrong")}}
    messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == ["nexus_workflows.I308"]
    assert "(AuthenticationError;" in messages[0].msg
    assert PASSWORD not in texts(messages)
    on(settings, port)  # no password: the server answers NOAUTH to INFO
    messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == ["nexus_workflows.I308"]
    assert "(AuthenticationError;" in messages[0].msg


# --- which queue ------------------------------------------------------------------------------


def test_only_the_queue_rq_queue_names_is_asked(settings: Any, redis_server: Callable[..., int]) -> None:
    port = redis_server("--maxmemory-policy", "volatile-lru", *AOF)
    with refusing_port() as unreachable:
        settings.RQ_QUEUES = {"default": {"URL": url(unreachable)}, "workflows": {"URL": url(port)}}
        settings.NEXUS_WORKFLOWS = {"RQ_QUEUE": "workflows"}
        messages = check_rq_redis_keeps_jobs()
    assert ids(messages) == ["nexus_workflows.W306"]
    assert messages[0].msg.startswith("The Redis of queue 'workflows' (NEXUS_WORKFLOWS['RQ_QUEUE'])")


def test_the_embedded_queue_is_not_asked(settings: Any) -> None:
    settings.RQ_QUEUES = {"default": embedded_queue()}
    assert check_rq_redis_keeps_jobs() == []


@pytest.mark.parametrize("rq_queue", ["missing", 5, ""])
def test_settings_the_other_checks_report_are_not_asked(settings: Any, rq_queue: Any) -> None:
    with refusing_port() as unreachable:
        # "" is a key here too: E302 reports an empty RQ_QUEUE whatever RQ_QUEUES holds.
        settings.RQ_QUEUES = {"default": {"URL": url(unreachable)}, "": {"URL": url(unreachable)}}
        settings.NEXUS_WORKFLOWS = {"RQ_QUEUE": rq_queue}
        assert check_rq_redis_keeps_jobs() == []
        settings.NEXUS_WORKFLOWS = {}  # the control: "default" is asked, and not reached
        assert ids(check_rq_redis_keeps_jobs()) == ["nexus_workflows.I308"]


def test_a_queue_on_a_host_and_port_is_asked(settings: Any, redis_server: Callable[..., int]) -> None:
    port = redis_server("--maxmemory-policy", "volatile-lfu", *AOF)
    settings.RQ_QUEUES = {"default": {"HOST": "127.0.0.1", "PORT": port, "DB": 0}}
    assert ids(check_rq_redis_keeps_jobs()) == ["nexus_workflows.W306"]


def test_a_queue_behind_sentinel_asks_the_master(
    settings: Any, redis_server: Callable[..., int], tmp_path: Path
) -> None:
    master = redis_server("--maxmemory-policy", "volatile-lru", *NO_PERSISTENCE)
    config = tmp_path / "sentinel.conf"
    config.write_text(f"sentinel monitor workflows 127.0.0.1 {master} 1\n")
    sentinel = redis_server(str(config), "--sentinel", ready="+monitor master workflows")
    settings.RQ_QUEUES = {
        "default": {"SENTINELS": [("127.0.0.1", sentinel)], "MASTER_NAME": "workflows", "DB": 0}
    }
    assert ids(check_rq_redis_keeps_jobs()) == ["nexus_workflows.W306", "nexus_workflows.W307"]


def test_a_sentinel_that_never_answers_is_given_up_within_the_timeout(settings: Any) -> None:
    """The sentinels are asked for the master at connect: with no timeouts of the queue's
    own (SENTINEL_KWARGS), the check's bound them."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        settings.RQ_QUEUES = {
            "default": {"SENTINELS": [silent.getsockname()], "MASTER_NAME": "workflows", "DB": 0}
        }
        began = time.monotonic()
        (messages,) = run_together(lambda _: check_rq_redis_keeps_jobs(), 1, timeout=PROBE_TIMEOUT + 3)
        took = time.monotonic() - began
    assert ids(messages) == ["nexus_workflows.I308"]
    assert "(MasterNotFoundError;" in messages[0].msg
    assert took < PROBE_TIMEOUT + 2


# --- only with --deploy -----------------------------------------------------------------------


def test_the_check_is_a_deployment_check_only() -> None:
    assert check_rq_redis_keeps_jobs in registry.get_checks(include_deployment_checks=True)
    assert check_rq_redis_keeps_jobs not in registry.get_checks()


@pytest.mark.django_db  # Django's own checks may read the database server
def test_the_server_is_asked_only_with_deploy(settings: Any, redis_server: Callable[..., int]) -> None:
    on(settings, redis_server("--maxmemory-policy", "volatile-lru", *NO_PERSISTENCE))
    assert ours(run_checks()) == []
    assert ids(ours(run_checks(include_deployment_checks=True))) == [
        "nexus_workflows.W306",
        "nexus_workflows.W307",
    ]


@pytest.mark.django_db
def test_manage_py_check_deploy_prints_the_warnings(settings: Any, redis_server: Callable[..., int]) -> None:
    on(settings, redis_server("--maxmemory-policy", "allkeys-lru", *NO_PERSISTENCE))
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    assert not any(check_id in out.getvalue() + err.getvalue() for check_id in OURS)
    call_command("check", deploy=True, stdout=out, stderr=err)
    printed = out.getvalue() + err.getvalue()
    assert "(nexus_workflows.W306) The Redis of queue 'default'" in printed
    assert "(nexus_workflows.W307) The Redis of queue 'default'" in printed

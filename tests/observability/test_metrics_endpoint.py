"""The endpoint of ``runworkflows --metrics-port`` itself: only a failure to listen is
blamed on the port; a connection that sends nothing is dropped after
``METRICS_IDLE_TIMEOUT`` (each holds a thread); histograms carry ``_created`` as
prometheus-client's own do. Real sockets, real scrapes over loopback."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from nexus_workflows.observability.runner_metrics import RunnerMetrics
from tests.processes import ManagePy, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_TIMEOUT = 0.5
DURATIONS = "nexus_workflows_attempt_duration_seconds"


@pytest.fixture
def endpoint() -> Iterator[tuple[RunnerMetrics, int]]:
    """A runner's metrics endpoint on a free port, with a short idle timeout."""
    with override_settings(NEXUS_WORKFLOWS={"METRICS_IDLE_TIMEOUT": IDLE_TIMEOUT}):
        metrics = RunnerMetrics(kinds=["test-outcomes"], using="default", in_flight=lambda: 0)
        port = metrics.serve("127.0.0.1", 0)
    try:
        yield metrics, port
    finally:
        metrics.stop()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


def connection_threads() -> int:
    """Threads serving a connection (socketserver's ThreadingMixIn names them so), of any
    server in this process: other threads of the process come and go as they will."""
    return sum("process_request_thread" in thread.name for thread in threading.enumerate())


def created_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.endswith("_created")
    }


def test_an_oserror_that_is_not_the_endpoints_is_not_blamed_on_the_port(tmp_path: Path) -> None:
    """The project's log file sits in a directory that is gone: the runner's first log line
    raises the system's FileNotFoundError, after the endpoint listens. On the old code:
    "cannot serve metrics on 127.0.0.1:0 (No such file or directory); choose another
    --metrics-port"."""
    log_file = tmp_path / "gone" / "runner.log"
    process = ManagePy(
        "runworkflows",
        "--once",
        "--kind",
        "test-outcomes",
        "--metrics-port",
        "0",
        env={"DJANGO_SETTINGS_MODULE": "tests.settings_log_file", "NEXUS_TEST_LOG_FILE": str(log_file)},
    )
    try:
        code = process.wait(timeout=60)
        output = process.output()
    finally:
        process.close()
    assert code != 0, output
    assert "FileNotFoundError" in output, output
    assert "cannot serve metrics" not in output, output
    assert "--metrics-port" not in output, output


def test_an_idle_connection_is_dropped_after_the_timeout(endpoint: tuple[RunnerMetrics, int]) -> None:
    """On the old code the connection stayed open (and its thread alive) for good."""
    _, port = endpoint
    baseline = connection_threads()
    began = time.monotonic()  # the server's clock starts at its accept, after this
    with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
        wait_for(lambda: connection_threads() == baseline + 1, timeout=10, what="its thread to start")
        try:
            received = idle.recv(1024)  # nothing sent: b"" once the server closes it
        except TimeoutError:
            pytest.fail("the endpoint kept an idle connection open for 10 s")
        held = time.monotonic() - began
    assert received == b""
    assert IDLE_TIMEOUT * 0.8 <= held < 5, held
    wait_for(lambda: connection_threads() == baseline, timeout=10, what="its thread to end")
    assert "nexus_workflows_in_flight 0.0" in scrape(port)  # the endpoint still serves


def test_a_taken_port_still_names_the_port() -> None:
    from nexus_workflows.observability.metrics_server import MetricsEndpointUnavailable

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = RunnerMetrics(kinds=[], using="default", in_flight=lambda: 0)
        with pytest.raises(MetricsEndpointUnavailable, match=f"cannot serve metrics on 127.0.0.1:{port} \\("):
            metrics.serve("127.0.0.1", port)


def metrics_host_error(host: str) -> str:
    """What ``runworkflows --metrics-host HOST`` ends with when it cannot listen there."""
    with pytest.raises(CommandError) as raised:
        call_command(
            "runworkflows", "--once", "--kind", "test-outcomes", "--metrics-port", "0", "--metrics-host", host
        )
    return str(raised.value)


def test_a_host_that_does_not_resolve_is_named_not_the_port() -> None:
    """``.invalid`` never resolves (RFC 6761). On the old code: "cannot serve metrics on
    nx-no-such-host.invalid:0 (...); choose another --metrics-port"."""
    message = metrics_host_error("nx-no-such-host.invalid")
    assert message.startswith("cannot serve metrics on nx-no-such-host.invalid:0 ("), message
    assert "--metrics-host nx-no-such-host.invalid does not resolve to an address" in message
    assert "give an IP address of this host (127.0.0.1 or ::1" in message
    assert "--metrics-port" not in message


def test_an_address_not_this_hosts_is_named_not_the_port() -> None:
    """192.0.2.1 (TEST-NET-1) is no address of this host: the bind's EADDRNOTAVAIL."""
    message = metrics_host_error("192.0.2.1")
    assert "--metrics-host 192.0.2.1 is not an address of this host" in message, message
    assert "--metrics-port" not in message


class HeldCollector(Collector):
    """A collector whose scrapes wait until :attr:`release` is set (a slow database)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.inside = 0

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        self.inside += 1
        self.release.wait(30)
        return []


def closed_at_once(port: int) -> bool:
    """Whether a new connection is closed by the endpoint without an answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as beyond:
        beyond.settimeout(5)
        try:
            return beyond.recv(1024) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False  # kept open


@pytest.fixture
def two_slots() -> Iterator[tuple[RunnerMetrics, int]]:
    """An endpoint serving two connections at once; a 30 s idle timeout."""
    settings = {"METRICS_IDLE_TIMEOUT": 30, "METRICS_MAX_CONNECTIONS": 2}
    with override_settings(NEXUS_WORKFLOWS=settings):
        metrics = RunnerMetrics(kinds=[], using="default", in_flight=lambda: 0)
        port = metrics.serve("127.0.0.1", 0)
    try:
        yield metrics, port
    finally:
        metrics.stop()


def test_connections_beyond_the_cap_are_closed_at_once(two_slots: tuple[RunnerMetrics, int]) -> None:
    """Two slots, each answering a scrape (held in its collection): a third connection is
    closed at once, without a thread; once a scrape is answered, a scrape is served. On
    the code before the cap the third got a thread of its own and was kept open."""
    metrics, port = two_slots
    held = HeldCollector()
    metrics.registry.register(held)
    baseline = connection_threads()
    answers: list[str] = []
    scrapes = [threading.Thread(target=lambda: answers.append(scrape(port))) for _ in range(2)]
    for thread in scrapes:
        thread.start()
    try:
        wait_for(lambda: held.inside == 2, timeout=10, what="two scrapes collecting")
        assert closed_at_once(port)
        assert connection_threads() == baseline + 2
    finally:
        held.release.set()
        for thread in scrapes:
            thread.join(10)
    assert len(answers) == 2
    assert "nexus_workflows_in_flight 0.0" in scrape(port)


def test_connections_that_send_nothing_give_way_to_a_scrape(two_slots: tuple[RunnerMetrics, int]) -> None:
    """Two slots, held by clients that send nothing (renewed within the idle timeout, they
    would hold them for good): a scrape is served, and the oldest of them is shut to make
    room. On the old code the scrape's connection was closed at once ("Remote end closed
    connection without response")."""
    _, port = two_slots
    baseline = connection_threads()
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    try:
        wait_for(lambda: connection_threads() == baseline + 2, timeout=10, what="two connection threads")
        assert "nexus_workflows_in_flight 0.0" in scrape(port)
        assert held[0].recv(1024) == b""  # the oldest gave way
        held[1].settimeout(0.2)
        with pytest.raises(TimeoutError):
            held[1].recv(1024)  # the other is still open
    finally:
        for connection in held:
            connection.close()


def test_a_duration_histogram_has_its_created_time(endpoint: tuple[RunnerMetrics, int]) -> None:
    """prometheus-client's own Histogram gives ``<name>_created`` per series, as its
    Counter does; our collector gave the counters theirs but not the histogram."""
    metrics, port = endpoint
    metrics.observe_duration("test-outcomes", 0.2)
    found = created_samples(scrape(port))
    created = found[(f"{DURATIONS}_created", (("kind", "test-outcomes"),))]
    assert abs(created - time.time()) < 60
    assert ("nexus_workflows_claims_created", ()) in found


def test_created_series_follow_prometheus_clients_switch(endpoint: tuple[RunnerMetrics, int]) -> None:
    """``disable_created_metrics()`` (or PROMETHEUS_DISABLE_CREATED_SERIES) takes them off
    prometheus-client's own metrics; ours follow it."""
    _, port = endpoint
    prometheus_client.disable_created_metrics()
    try:
        assert created_samples(scrape(port)) == {}
    finally:
        prometheus_client.enable_created_metrics()
    assert created_samples(scrape(port))


def test_a_request_trickling_in_is_dropped_after_the_timeout(endpoint: tuple[RunnerMetrics, int]) -> None:
    """A byte now and then (each within the timeout) no longer holds the connection's
    thread: the whole request must be in within METRICS_IDLE_TIMEOUT."""
    _, port = endpoint
    baseline = connection_threads()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as trickle:
        wait_for(lambda: connection_threads() == baseline + 1, timeout=10, what="its thread to start")
        began = time.monotonic()
        for byte in b"GET /metrics HTTP/1.0\r\n"[:12]:  # a byte every half of the timeout, 6 timeouts
            try:
                trickle.sendall(bytes([byte]))
            except ConnectionError:
                break  # dropped
            if connection_threads() == baseline:
                break
            time.sleep(IDLE_TIMEOUT / 2)
        wait_for(lambda: connection_threads() == baseline, timeout=10, what="its thread to end")
        held = time.monotonic() - began
    assert held < IDLE_TIMEOUT * 3, held
    assert "nexus_workflows_in_flight 0.0" in scrape(port)  # the endpoint still serves

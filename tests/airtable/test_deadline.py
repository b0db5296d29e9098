"""``AIRTABLE_TIMEOUT`` bounds a whole request (airtable/deadline.py), observed through real
HTTP on loopback: a server that drips its answer a byte every 0.1 s is never silent long
enough for requests' own timeouts, which bound each wait on the socket.

Each test bounds the call from above by the drip's own clock: the emulator counts the bytes
it dripped before the client gave up, at most ``DEADLINE + SLACK`` seconds' worth. Without the
deadline the whole drip (72-200 bytes, 7-20 s) is sent instead. A bound in seconds failed on a
loaded machine (4.4 s, 10.2 s for 3 s at a load of 14-18): the drip slows with the client
there, so its bytes still measure the deadline.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from django.db import connection
from urllib3.util import Timeout

from nexus_workflows.airtable import AirtableNetworkError, add_record, get_records
from nexus_workflows.airtable.deadline import DeadlineAdapter
from nexus_workflows.models import FlowWindowSlot
from tests.airtable.conftest import BASE
from tests.airtable.emulator import AirtableEmulator, RecordedRequest
from tests.loopback import LoopbackListener
from tests.processes import wait_for

PATIENT = "Maria Lopez"  # stands for patient data: must never reach messages or logs
DEADLINE = 1.0
SLACK = 2.0  # of the drip's time: the client's leaving after its deadline, the emulator noticing
EVERY = 0.1  # far below the per-wait timeouts: only a deadline on the whole request ends it
ONE_START_PER_REQUEST = (100, 3600)  # a ring of 100 rows: each start takes a row of its own


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, the AirtableNetworkError raised or None)``: the time first, so that a
    call that outlasts its deadline fails on that, whatever it returns."""
    started = time.monotonic()
    try:
        call()
    except AirtableNetworkError as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def dripped(server: AirtableEmulator) -> list[RecordedRequest]:
    return [r for r in server.requests if r.fault == "drip"]


def given_up_by_the_deadline(request: RecordedRequest, every: float = EVERY) -> None:
    """The client went away from a dripped answer within ``DEADLINE + SLACK`` seconds of the
    drip's own pace (bytes sent before it noticed, a byte or two after the client left)."""
    wait_for(lambda: request.abandoned, timeout=30, what="the emulator to see the client go")
    assert request.dripped <= (DEADLINE + SLACK) / every, request.dripped


def starts() -> int:
    return FlowWindowSlot.objects.filter(name=f"airtable:{BASE}", started_at__year__gt=1971).count()


@pytest.fixture
def kept_alive(airtable_config: Callable[..., None]) -> Iterator[AirtableEmulator]:
    server = AirtableEmulator(keep_alive=True)
    airtable_config(server.url)
    yield server
    server.stop()


@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_dripping_answer_ends_at_the_deadline_as_a_read_timeout(
    airtable: AirtableEmulator, airtable_config: Callable[..., None], part: str
) -> None:
    airtable_config(airtable.url, AIRTABLE_TIMEOUT=DEADLINE, AIRTABLE_MAX_ATTEMPTS=1)
    airtable.add(BASE, "Patients", {"Name": PATIENT})
    airtable.drip(EVERY, part=part, method="GET")

    _, error = timed(lambda: get_records(BASE, "Patients", formula={"Name": PATIENT}))

    # Classified as a read timeout always was: transient, and the request reached Airtable.
    assert isinstance(error, AirtableNetworkError)
    assert error.failure == "timed out waiting for Airtable's answer"
    assert error.request_sent is True
    assert error.transient is True
    assert error.permanent is False
    assert error.cause.startswith("RequestDeadlineExceeded")
    assert PATIENT not in str(error)
    assert "127.0.0.1" not in str(error)
    assert len(airtable.requests) == 1
    given_up_by_the_deadline(airtable.requests[0])


def test_an_answer_cut_short_in_its_headers_is_not_taken_for_a_whole_one(
    airtable: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    # Its 72 bytes of status line and headers take 1.44 s: the deadline cuts the headers
    # after the status line, and http.client takes the end of the connection for their
    # end (a 200 with an empty body, which pyairtable would read as no answer at all).
    airtable_config(airtable.url, AIRTABLE_TIMEOUT=DEADLINE, AIRTABLE_MAX_ATTEMPTS=1)
    airtable.drip(0.02, part="headers", method="GET")

    _, error = timed(lambda: get_records(BASE, "Patients"))

    assert isinstance(error, AirtableNetworkError)
    assert error.cause.startswith("RequestDeadlineExceeded")
    (request,) = dripped(airtable)
    wait_for(lambda: request.abandoned, timeout=30, what="the emulator to see the client go")
    assert request.dripped < 72  # the client left before the headers were whole


def test_a_dripping_read_is_retried_each_attempt_with_its_deadline_and_one_start(
    airtable: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    airtable_config(airtable.url, AIRTABLE_TIMEOUT=DEADLINE, AIRTABLE_RATE_LIMIT=ONE_START_PER_REQUEST)
    airtable.add(BASE, "Patients", {"Name": "a"})
    airtable.drip(EVERY, method="GET", times=2)

    records = get_records(BASE, "Patients")

    assert [r["fields"] for r in records] == [{"Name": "a"}]
    assert [r.fault for r in airtable.requests] == ["drip", "drip", None]
    for request in dripped(airtable):  # each attempt held to its own deadline
        given_up_by_the_deadline(request)
    assert starts() == 3  # one start of the base's window per request sent


def test_a_dripping_answer_to_a_create_is_not_repeated(
    airtable: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    airtable_config(airtable.url, AIRTABLE_TIMEOUT=DEADLINE)
    airtable.drip(EVERY, method="POST", times=3)

    _, error = timed(lambda: add_record(BASE, "Patients", {"Name": PATIENT}))

    assert isinstance(error, AirtableNetworkError)
    assert error.request_sent is True
    assert error.attempts == 1
    given_up_by_the_deadline(airtable.requests_for("POST")[0])
    assert len(airtable.requests_for("POST")) == 1
    assert len(airtable.records(BASE, "Patients")) == 1  # carried out; only the answer was slow


def test_a_pair_bounds_the_whole_request_at_connect_plus_read(
    airtable: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    airtable_config(airtable.url, AIRTABLE_TIMEOUT=(0.5, 0.5), AIRTABLE_MAX_ATTEMPTS=1)
    airtable.drip(EVERY, method="GET")

    elapsed, error = timed(lambda: get_records(BASE, "Patients"))

    assert elapsed >= 0.95  # connect + read, not read alone (a late end is no failure of this)
    assert isinstance(error, AirtableNetworkError)
    given_up_by_the_deadline(airtable.requests[0])


def test_a_request_on_a_kept_alive_connection_is_held_to_the_deadline(
    kept_alive: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    airtable_config(kept_alive.url, AIRTABLE_TIMEOUT=DEADLINE, AIRTABLE_MAX_ATTEMPTS=1)
    assert get_records(BASE, "Patients") == []
    kept_alive.drip(EVERY, method="GET")

    _, error = timed(lambda: get_records(BASE, "Patients"))

    assert isinstance(error, AirtableNetworkError)
    given_up_by_the_deadline(dripped(kept_alive)[0])
    assert kept_alive.connections == 1  # the dripped request went over the first connection
    assert get_records(BASE, "Patients") == []  # the broken connection is not reused
    assert kept_alive.connections == 2


def test_an_answer_in_time_leaves_no_timer_and_keeps_its_connection(
    kept_alive: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    airtable_config(kept_alive.url, AIRTABLE_TIMEOUT=0.3)
    for _ in range(3):
        assert get_records(BASE, "Patients") == []
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name == "airtable-request-deadline"],
        timeout=5,
        what="the deadline timers gone",
    )
    # No timer is left to shut the kept-alive connection down under a later request.
    assert get_records(BASE, "Patients") == []
    assert kept_alive.connections == 1


class TricklingProxy(LoopbackListener):
    """An HTTP proxy that reads a client's ``CONNECT`` and answers it a byte every
    ``every`` seconds: the connection through it is never ready, and never silent long
    enough for the connect timeout."""

    ANSWER = b"HTTP/1.1 200 Connection established\r\nX-Padding: " + b"x" * 160 + b"\r\n\r\n"

    def __init__(self, every: float) -> None:
        self.every = every
        #: Per connection: bytes of the answer sent, until the client went away (as the emulator's).
        self.sent: dict[int, int] = {}
        self.abandoned: dict[int, bool] = {}
        super().__init__()
        self.url = f"http://127.0.0.1:{self.port}"

    def handle(self, connection: socket.socket, index: int) -> None:
        self.sent[index], self.abandoned[index] = 0, False
        try:
            connection.recv(65536)  # CONNECT host:443
            for byte in self.ANSWER:  # 20 s
                connection.sendall(bytes([byte]))
                self.sent[index] += 1
                if self.stopping(self.every):
                    return
        except OSError:
            self.abandoned[index] = True  # the client gave up

    def all_abandoned(self) -> bool:
        """Every connection accepted was left by its client (and there was one)."""
        return 0 < self.connections == len(self.abandoned) and all(self.abandoned.values())


def test_a_proxy_that_trickles_its_tunnel_ends_at_the_deadline_and_counts_as_not_sent(
    airtable_config: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = TricklingProxy(EVERY)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    # Never reached: requests opens a tunnel through the proxy instead.
    airtable_config("https://127.0.0.1:9", AIRTABLE_TIMEOUT=DEADLINE, AIRTABLE_MAX_ATTEMPTS=2)
    try:
        _, error = timed(lambda: add_record(BASE, "Patients", {"Name": PATIENT}))
        # Each attempt left its tunnel within its deadline, by the trickle's own pace.
        wait_for(lambda: proxy.all_abandoned(), timeout=30, what="the proxy to see the client go")
    finally:
        proxy.stop()

    assert all(sent <= (DEADLINE + SLACK) / EVERY for sent in proxy.sent.values()), proxy.sent
    # Still connecting: nothing of the request was sent, so even a create is tried again.
    assert isinstance(error, AirtableNetworkError)
    assert error.failure == "timed out connecting to Airtable"
    assert error.request_sent is False
    assert error.attempts == 2
    assert proxy.connections == 2
    assert error.cause.startswith("ConnectDeadlineExceeded")
    assert PATIENT not in str(error)


@pytest.mark.django_db(transaction=True)  # the thread takes the base's window on its own connection
def test_called_from_async_code_in_a_thread_the_deadline_ends_the_call(
    airtable: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    # The way README tells an async def prepare to call the helpers.
    airtable_config(airtable.url, AIRTABLE_TIMEOUT=DEADLINE, AIRTABLE_MAX_ATTEMPTS=1)
    airtable.drip(EVERY, method="GET")
    ticks = 0

    def in_a_thread() -> tuple[float, Any]:
        try:
            return timed(lambda: get_records(BASE, "Patients"))
        finally:
            connection.close()  # the thread's own (the base's window): it would outlive the test

    async def prepare() -> tuple[float, Any]:
        nonlocal ticks

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticker = asyncio.get_running_loop().create_task(tick())
        try:
            return await asyncio.to_thread(in_a_thread)
        finally:
            ticker.cancel()

    _, error = asyncio.run(prepare())

    assert isinstance(error, AirtableNetworkError)
    assert error.request_sent is True
    given_up_by_the_deadline(airtable.requests[0])
    assert ticks >= 5  # the event loop ran meanwhile


def test_a_timeout_whose_total_is_urllib3s_default_sends_without_a_deadline(
    emulator: AirtableEmulator,
) -> None:
    # Timeout(total=Timeout.DEFAULT_TIMEOUT) is urllib3's "no total of its own". The adapter
    # armed its timer with that sentinel: the timer's thread died of a TypeError (found by
    # mypy: Timeout.total is float | the sentinel | None).
    failed: list[type[BaseException]] = []
    session = requests.Session()
    session.mount("http://", DeadlineAdapter())
    previous_hook = threading.excepthook
    threading.excepthook = lambda args: failed.append(args.exc_type)
    try:
        timeout = Timeout(total=Timeout.DEFAULT_TIMEOUT)
        response = session.get(f"{emulator.url}/v0/{BASE}/Patients", timeout=timeout)
        for timer in [t for t in threading.enumerate() if t.name == "airtable-request-deadline"]:
            timer.join(timeout=5)
    finally:
        threading.excepthook = previous_hook
        session.close()

    assert response.status_code == 401  # answered (the request has no API key)
    assert failed == []

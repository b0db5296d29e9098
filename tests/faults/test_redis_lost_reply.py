"""Fault suite: the reply to the job's atomic create is lost (the connection drops after
Redis ran the create, before its answer came back), and redis-py sends the create again: by
default on a client built from host and port (django-rq's for a queue configured with HOST
and PORT), and on a queue configured with URL because the app gives its client the same
retry. The retried create finds the job it made itself; ``enqueue`` must still say it
created it (its id), not report a duplicate (``None``) — while a true duplicate stays
``None``."""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq import SimpleWorker
from rq.job import JobStatus
from rq.queue import Queue

from nexus_workflows import enqueue
from nexus_workflows.fire_and_forget import get_queue
from tests.faults.servers import PrivateRedis
from tests.processes import wait_for
from tests.tcp_proxy import TcpProxy
from tests.testapp.models import Ledger

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgresql,  # once per CI run: the fault suite runs on the PostgreSQL leg
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]

LEDGER = "test-ff-ledger"


class ReplyDroppingProxy(TcpProxy):
    """A loopback proxy that, once armed, forwards the next script call (``EVALSHA``, RQ's
    atomic create) to Redis and, when Redis answers that it created the job (``:1``), drops
    the client's connection instead of passing the answer on."""

    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self.armed = threading.Event()
        self.dropped = threading.Event()
        # Set: the create sent again after the drop waits here until ``release``.
        self.hold_retry = threading.Event()
        self.retry_held = threading.Event()
        self.release = threading.Event()
        self._awaiting: set[socket.socket] = set()  # upstreams whose next answer is a create's

    def _passes(self, data: bytes, source: socket.socket, upstream: socket.socket) -> bool:
        retried = source is not upstream and self.dropped.is_set() and b"EVALSHA" in data.upper()
        if retried and self.hold_retry.is_set() and not self.retry_held.is_set():
            self.retry_held.set()
            self.release.wait(60)
        if source is not upstream and self.armed.is_set() and b"EVALSHA" in data.upper():
            self._awaiting.add(upstream)  # before the request goes: its answer may be fast
        elif source is upstream and upstream in self._awaiting:
            self._awaiting.discard(upstream)
            if data.startswith(b":1\r\n"):
                self.armed.clear()
                self.dropped.set()
                return False  # the answer is never passed on
        return True


@pytest.fixture(params=["host-port", "url", "url-one-retry"])
def proxied_redis(settings: Any, request: Any) -> Iterator[tuple[PrivateRedis, ReplyDroppingProxy]]:
    server = PrivateRedis()
    proxy: ReplyDroppingProxy | None = None
    try:
        server.start()  # its port is known once it listens: another, if the first was taken
        proxy = ReplyDroppingProxy("127.0.0.1", server.port)
        proxy.start()
        # HOST and PORT: django-rq builds redis.Redis(host=…), whose default Retry sends a
        # command again after a connection error. URL: it builds Redis.from_url(…), whose
        # clients had no retry before the app gave them the same one. One retry of the
        # operator's own (README: how to bound enqueue's tries of a Redis that is down).
        if request.param == "url":
            where: dict[str, Any] = {"URL": f"redis://127.0.0.1:{proxy.port}/0"}
        elif request.param == "url-one-retry":
            where = {
                "URL": f"redis://127.0.0.1:{proxy.port}/0",
                "REDIS_CLIENT_KWARGS": {"retry": Retry(NoBackoff(), 1)},
            }
        else:
            where = {"HOST": "127.0.0.1", "PORT": proxy.port, "DB": 0}
        settings.RQ_QUEUES = {"default": {**where, "DEFAULT_TIMEOUT": 60}}
        yield server, proxy
    finally:
        if proxy is not None:
            proxy.release.set()
            proxy.close()
        server.cleanup()


@pytest.mark.parametrize("delay", [0, 3600], ids=["queued", "scheduled"])
def test_a_create_whose_reply_is_lost_and_retried_returns_the_job_id_not_a_duplicate(
    proxied_redis: tuple[PrivateRedis, ReplyDroppingProxy], delay: int
) -> None:
    _, proxy = proxied_redis
    assert enqueue(LEDGER, {"key": "warm-up"}, delay=delay) is not None  # the script is loaded
    proxy.armed.set()

    job_id = enqueue(LEDGER, {"key": "lost-reply"}, delay=delay)

    assert proxy.dropped.is_set(), "the proxy never dropped a create's answer"
    assert job_id is not None, "enqueue reported its own job as a duplicate"
    assert get_queue("default").fetch_job(job_id) is not None
    # A later enqueue of the key is a true duplicate, with nothing dropped.
    assert enqueue(LEDGER, {"key": "lost-reply"}, delay=delay) is None


def run_jobs_directly(server: PrivateRedis) -> Queue:
    """One in-process RQ worker in burst mode on a connection of its own (not through the
    proxy); the queue it ran."""
    queue = Queue("default", connection=redis.Redis(host="127.0.0.1", port=server.port))
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        SimpleWorker([queue], connection=queue.connection).work(burst=True, logging_level="WARNING")
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return queue


def test_a_job_run_between_the_lost_answer_and_the_retry_is_found_not_created_again(
    proxied_redis: tuple[PrivateRedis, ReplyDroppingProxy],
) -> None:
    server, proxy = proxied_redis
    assert enqueue(LEDGER, {"key": "warm-up"}) is not None
    proxy.armed.set()
    proxy.hold_retry.set()
    returned: dict[str, str | None] = {}
    caller = threading.Thread(
        target=lambda: returned.update(job_id=enqueue(LEDGER, {"key": "ran-meanwhile"}))
    )
    caller.start()
    try:
        # The answer is lost and the create sent again is held: a worker runs the job now.
        wait_for(proxy.retry_held.is_set, timeout=30, what="the create sent again after the lost answer")
        queue = run_jobs_directly(server)
        job_id = f"{LEDGER}__ran-meanwhile"
        assert queue.fetch_job(job_id).get_status() == JobStatus.FINISHED
    finally:
        proxy.release.set()
        caller.join(60)

    assert returned == {"job_id": job_id}
    assert queue.count == 0  # nothing queued again
    assert Ledger.objects.filter(kind=LEDGER, key="ran-meanwhile").count() == 1

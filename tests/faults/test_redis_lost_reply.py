"""Fault suite: the reply to the job's atomic create is lost (the connection drops after
Redis ran the create, before its answer came back), and redis-py, which retries a command on
a connection error by default (a client built from host and port, as django-rq does for a
queue configured with HOST and PORT), sends the create again. The retried create finds the job it
made itself; ``enqueue`` must still say it created it (its id), not report a duplicate
(``None``) — while a true duplicate stays ``None``."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nexus_workflows import enqueue
from nexus_workflows.fire_and_forget import get_queue
from tests.faults.servers import PrivateRedis
from tests.tcp_proxy import TcpProxy

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
        self._awaiting: set[socket.socket] = set()  # upstreams whose next answer is a create's

    def _passes(self, data: bytes, source: socket.socket, upstream: socket.socket) -> bool:
        if source is not upstream and self.armed.is_set() and b"EVALSHA" in data.upper():
            self._awaiting.add(upstream)  # before the request goes: its answer may be fast
        elif source is upstream and upstream in self._awaiting:
            self._awaiting.discard(upstream)
            if data.startswith(b":1\r\n"):
                self.armed.clear()
                self.dropped.set()
                return False  # the answer is never passed on
        return True


@pytest.fixture
def proxied_redis(settings: Any) -> Iterator[tuple[PrivateRedis, ReplyDroppingProxy]]:
    server = PrivateRedis()
    proxy = ReplyDroppingProxy("127.0.0.1", server.port)
    try:
        server.start()
        proxy.start()
        # HOST and PORT, not URL: django-rq then builds redis.Redis(host=…), whose default
        # Retry sends a command again after a connection error (from_url's clients do not).
        settings.RQ_QUEUES = {
            "default": {"HOST": "127.0.0.1", "PORT": proxy.port, "DB": 0, "DEFAULT_TIMEOUT": 60}
        }
        yield server, proxy
    finally:
        proxy.cut()
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

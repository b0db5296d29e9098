"""Fault suite: a private ``redis-server`` killed by PID (``kill -9``) during a
1,000-enqueue burst of fire-and-forget work, and started again. Every ``QueueUnavailable``
says the job may exist and that enqueueing again is safe; the caller does so, and every job
runs exactly once: nothing lost, nothing twice."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from nexus_workflows import QueueUnavailable, enqueue
from tests.faults.servers import PrivateRedis
from tests.testapp.models import Ledger

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgresql,  # once per CI run: the fault suite runs on the PostgreSQL leg
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]

ENQUEUES = 1000
KILL_AFTER = 300  # enqueues sent before the server is killed
DOWN_FOR = 1.0  # seconds the server stays dead


@pytest.fixture
def private_redis(settings: Any) -> Iterator[PrivateRedis]:
    server = PrivateRedis()
    try:
        server.start()
        # A client that never sends a command again (redis-py's default retry, which URL
        # queues get too, would bridge this short outage): each connection failure reaches
        # the caller as QueueUnavailable, as one longer than the retries would.
        no_retry = {"REDIS_CLIENT_KWARGS": {"retry": Retry(NoBackoff(), 0)}}
        settings.RQ_QUEUES = {
            "default": {"HOST": "127.0.0.1", "PORT": server.port, "DB": 0, "DEFAULT_TIMEOUT": 60, **no_retry}
        }
        yield server
    finally:
        server.cleanup()


def run_every_job() -> int:
    from rq import SimpleWorker

    from nexus_workflows.fire_and_forget import get_queue

    queue = get_queue("default")
    worker = SimpleWorker([queue], connection=queue.connection)
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        worker.work(burst=True, logging_level="WARNING")
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    return len(queue.finished_job_registry)


def test_redis_killed_during_an_enqueue_burst_loses_nothing_and_runs_nothing_twice(
    private_redis: PrivateRedis, report_figures: Callable[[str], None]
) -> None:
    sent = threading.Event()
    outage: dict[str, float] = {}

    def kill_then_restart() -> None:
        sent.wait(60)
        outage["killed"] = time.monotonic()
        private_redis.kill()
        threading.Event().wait(DOWN_FOR)
        private_redis.start()
        outage["back"] = time.monotonic()

    killer = threading.Thread(target=kill_then_restart)
    killer.start()
    unavailable: list[str] = []
    retried_keys: set[str] = set()
    results: dict[str, str | None] = {}
    began = time.monotonic()
    try:
        for number in range(ENQUEUES):
            key = str(number)
            if number == KILL_AFTER:
                sent.set()  # killed while the next enqueues are in flight
            deadline = time.monotonic() + 60
            while True:
                try:
                    results[key] = enqueue("test-ff-ledger", {"key": key})
                    break
                except QueueUnavailable as error:
                    unavailable.append(str(error))
                    retried_keys.add(key)
                    assert time.monotonic() < deadline, "Redis did not come back"
                    threading.Event().wait(0.05)
    finally:
        sent.set()
        killer.join(30)
    burst = time.monotonic() - began
    ran = run_every_job()

    runs = Counter(Ledger.objects.filter(kind="test-ff-ledger").values_list("key", flat=True))
    duplicates_refused = sum(1 for job_id in results.values() if job_id is None)
    report_figures(
        f"Redis kill -9: {ENQUEUES} enqueues in {burst:.1f}s, server killed after "
        f"{KILL_AFTER} and back after {outage['back'] - outage['killed']:.2f}s; QueueUnavailable raised "
        f"{len(unavailable)} times for {len(retried_keys)} keys, each enqueued again; "
        f"{duplicates_refused} retries found the job already there; jobs run {ran}; "
        f"keys run once {sum(1 for n in runs.values() if n == 1)}"
    )
    assert unavailable, "the kill did not interrupt the burst"
    for message in unavailable:
        assert "nothing was enqueued" not in message
        assert "the job may exist; enqueueing the same trigger again is safe" in message
    assert set(runs) == {str(n) for n in range(ENQUEUES)}  # 0 lost
    assert [key for key, count in runs.items() if count > 1] == []  # 0 run twice
    assert ran == ENQUEUES

"""Fault suite: a backlog of 1,000 workflow jobs cancelled past the horizon, on a private
``redis-server``. The sweep that deletes them runs inside enqueues, so each enqueue takes at
most a bounded page of the backlog (counted with ``MONITOR``: the commands clients sent,
not those a script ran inside Redis), and enqueues of other keys clear it all in the end."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from rq.registry import CanceledJobRegistry

from nexus_workflows import enqueue
from nexus_workflows.fire_and_forget import get_queue, job_id_for
from nexus_workflows.fire_and_forget.cancelled import SWEEP_BATCH

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgresql,  # once per CI run: the fault suite runs on the PostgreSQL leg
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]

LEDGER = "test-ff-ledger"
BACKLOG = 1000
# Commands one enqueue may send: RQ's registration of the queue (MULTI, SADD, EXEC: one round
# trip), the create (EVALSHA), the sweep's page (ZRANGEBYSCORE) and its script (EVALSHA; and
# SCRIPT LOAD and EVALSHA again the first time the server sees it). Before: 12,014.
MAX_COMMANDS_PER_ENQUEUE = 8


class Monitor:
    """The commands clients send to a Redis server, read through ``MONITOR`` on a thread;
    ``between_marks`` returns those sent since the last mark, up to a new one."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.commands: list[str] = []
        self._seen = threading.Condition()
        self._monitor = client.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self.between_marks()

    def _read(self) -> None:
        try:
            for command in self._monitor.listen():
                if command["client_type"] == "lua":
                    continue  # run by a script inside Redis: no round trip of its own
                with self._seen:
                    self.commands.append(command["command"])
                    self._seen.notify_all()
        except (redis.exceptions.ConnectionError, OSError, AttributeError, ValueError):
            # Closed at the end of the test, maybe while its read was in the socket's buffer
            # ("I/O operation on closed file"): an error of that thread's would be reported.
            return

    def between_marks(self) -> list[str]:
        mark = f"ECHO nw-mark-{uuid.uuid4().hex}"
        self.client.execute_command(*mark.split())
        with self._seen:
            assert self._seen.wait_for(lambda: mark in self.commands, 30), "MONITOR never saw the mark"
            index = self.commands.index(mark)
            sent, self.commands = self.commands[:index], self.commands[index + 1 :]
        return sent

    def close(self) -> None:
        self._monitor.connection.disconnect()
        self._thread.join(10)


@pytest.fixture
def monitor(private_redis_client: redis.Redis) -> Iterator[Monitor]:
    watching = Monitor(private_redis_client)
    try:
        yield watching
    finally:
        watching.close()


def cancel_backlog(count: int) -> float:
    """``count`` workflow jobs made by ``enqueue`` and cancelled with RQ's ``job.cancel()``;
    the latest cancel's time in the canceled registry."""
    queue = get_queue("default")
    for number in range(count):
        job_id = enqueue(LEDGER, {"key": f"backlog-{number}"})
        assert job_id is not None
        queue.fetch_job(job_id).cancel()
    registry = CanceledJobRegistry(queue=queue)
    assert registry.count == count
    return max(score for _, score in queue.connection.zrange(registry.key, 0, -1, withscores=True))


def wait_for_redis_time(client: redis.Redis, at_least: float, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (lambda now: now[0] + now[1] / 1e6)(client.time()) < at_least:
        assert time.monotonic() < deadline, "timed out waiting for Redis's clock"
        time.sleep(0.05)


def test_a_backlog_of_cancelled_jobs_is_cleared_over_enqueues_each_doing_a_bounded_page(
    private_redis_client: redis.Redis,
    monitor: Monitor,
    settings: Any,
    report_figures: Callable[[str], None],
) -> None:
    # A long horizon while the backlog is made (no enqueue sweeps it yet), then a short one.
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 3600}
    last_cancel = cancel_backlog(BACKLOG)
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 2}
    # RQ records a cancel in whole seconds, rounded down: one more second is waited.
    wait_for_redis_time(private_redis_client, last_cancel + 3)
    registry = CanceledJobRegistry(queue=get_queue("default"))

    sent_per_enqueue: list[int] = []
    seconds_per_enqueue: list[float] = []
    for number in range(BACKLOG // SWEEP_BATCH + 2):
        monitor.between_marks()  # what the test itself sent is not counted
        began = time.perf_counter()
        assert enqueue(LEDGER, {"key": f"after-{number}"}) is not None
        seconds_per_enqueue.append(time.perf_counter() - began)
        sent_per_enqueue.append(len(monitor.between_marks()))
        if registry.count == 0:
            break

    report_figures(
        f"sweep of a {BACKLOG}-job backlog: {len(sent_per_enqueue)} enqueues, commands sent per "
        f"enqueue {sent_per_enqueue}, slowest enqueue {max(seconds_per_enqueue) * 1000:.1f} ms "
        "(with MONITOR attached)"
    )
    assert max(sent_per_enqueue) <= MAX_COMMANDS_PER_ENQUEUE, sent_per_enqueue
    assert registry.count == 0, f"{registry.count} cancelled jobs left after {len(sent_per_enqueue)} enqueues"
    queue = get_queue("default")
    assert not any(
        queue.connection.exists(queue.job_class.key_for(job_id_for(LEDGER, f"backlog-{number}")))
        for number in range(BACKLOG)
    )

"""The pinned RQ and redis-py stop a worker within seconds, against the real Redis.

Every RQ worker listens on a pub/sub channel in a thread whose wait for a message lasts up
to 60 s (rq's ``sleep_time``). redis 8.2.0's ``PubSubWorkerThread.stop()`` waits for that
thread without a bound, so a worker whose thread had already read its unsubscribe reply
before the stop (about one burst in 300 here) took 60 s to stop: ``rqworker --burst``
runs, deploys and this suite's burst workers stalled, and a job's result horizon (the
dedupe-horizon test's 3 s) passed before the test read it. redis 8.1 stops the thread and
closes the connection within rq's one-second join. ``pyproject.toml`` excludes 8.2.0; this test guards a bump.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
import redis
from rq import SimpleWorker
from rq.queue import Queue

from tests.processes import wait_for

pytestmark = pytest.mark.redis

# rq's own join of the thread is 1 s; the rest is the server's round trips.
PROMPT_STOP = 10.0


def waits_for_a_subscription(thread: threading.Thread) -> bool:
    """Whether ``thread`` is idle in pub/sub's wait for a subscription (redis-py's
    ``subscribed_event.wait``), where only its timeout would end it: blocked in a
    ``threading`` wait (not reading the socket, nor still handling the unsubscribe reply)
    under a ``get_message`` of a pub/sub with nothing subscribed."""
    frame = sys._current_frames().get(thread.ident or 0)
    if frame is None:
        return False
    if (frame.f_code.co_name, Path(frame.f_code.co_filename).name) != ("wait", "threading.py"):
        return False
    while frame is not None:
        if frame.f_code.co_name == "get_message":
            return not frame.f_locals["self"].subscribed
        frame = frame.f_back
    return False


def test_a_worker_whose_listener_is_idle_stops_within_seconds(rq_redis: redis.Redis) -> None:
    worker = SimpleWorker([Queue("stop-probe", connection=rq_redis)], connection=rq_redis)
    worker.subscribe()
    assert worker.pubsub is not None
    assert worker.pubsub_thread is not None
    # The listener reads its unsubscribe reply before the stop: the state one burst in a few
    # hundred reaches by itself, between rq's unsubscribe and its stop of the thread.
    worker.pubsub.unsubscribe()
    wait_for(
        lambda: waits_for_a_subscription(worker.pubsub_thread),
        timeout=30,
        what="the listener to wait for a subscription",
    )

    stopper = threading.Thread(target=worker.unsubscribe, daemon=True)
    stopper.start()
    stopper.join(PROMPT_STOP)

    assert not stopper.is_alive(), (
        f"the worker's stop still waits after {PROMPT_STOP:.0f} s on its pub/sub listener "
        f"(redis {redis.__version__}); rq's listener waits up to 60 s"
    )

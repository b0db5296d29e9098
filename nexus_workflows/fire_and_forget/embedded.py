"""The embedded Redis: fire-and-forget workflows with no Redis server at all.

A project with no ``REDIS_URL`` points its django-rq queues at an in-process fakeredis
server (with Lua, so RQ's atomic ``unique`` check works) and makes them synchronous: the
job runs at enqueue, in the caller's process, still through RQ::

    from nexus_workflows.fire_and_forget.embedded import embedded_queue

    RQ_QUEUES = {"default": {"URL": REDIS_URL}} if REDIS_URL else {"default": embedded_queue()}

The server lives as long as the process: jobs, results and dedupe keys are not shared
with other processes and are forgotten at restart. That suits development, demos and
single-process tools; production sets ``REDIS_URL`` and runs ``manage.py rqworker``.

This module is imported from settings modules, so it must not import Django models or
read settings at import time.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import fakeredis
import redis
from django.conf import settings

from nexus_workflows.conf import app_settings

logger = logging.getLogger("nexus_workflows.embedded")  # the name it has always logged under

_lock = threading.Lock()
_server: fakeredis.FakeServer | None = None

# Shown where django-rq displays a queue's connection; nothing listens there.
EMBEDDED_HOST = "embedded-fakeredis"


def embedded_server() -> fakeredis.FakeServer:
    """The one in-process fakeredis server of this process."""
    global _server
    with _lock:
        if _server is None:
            _server = fakeredis.FakeServer()
        return _server


def embedded_queue(**options: Any) -> dict[str, Any]:
    """An ``RQ_QUEUES`` entry for a synchronous queue on the in-process server.

    ``options`` are other django-rq queue settings, e.g. ``DEFAULT_TIMEOUT=360``.
    """
    pool = redis.ConnectionPool(connection_class=fakeredis.FakeRedisConnection, server=embedded_server())
    return {
        # django-rq builds the client from HOST/PORT/DB plus REDIS_CLIENT_KWARGS; the
        # pool makes it talk to the fake server instead of opening a socket.
        "HOST": EMBEDDED_HOST,
        "PORT": 0,
        "DB": 0,
        **options,
        # No worker can see an in-process server, so the job must run at enqueue.
        "ASYNC": False,
        "REDIS_CLIENT_KWARGS": {"connection_pool": pool},
    }


def is_embedded(queue_config: Any) -> bool:
    """Whether an ``RQ_QUEUES`` entry talks to an in-process fakeredis server."""
    if not isinstance(queue_config, dict):
        return False
    client_kwargs = queue_config.get("REDIS_CLIENT_KWARGS")
    if not isinstance(client_kwargs, dict):
        return False
    pool = client_kwargs.get("connection_pool")
    connection_class = getattr(pool, "connection_class", None)
    # fakeredis.FakeConnection (deprecated) is a factory function in fakeredis 2.x that
    # builds a FakeRedisConnection; projects may still configure either.
    return connection_class is fakeredis.FakeConnection or (
        isinstance(connection_class, type) and issubclass(connection_class, fakeredis.FakeRedisConnection)
    )


_warned_queues: set[str] = set()
_warned_lock = threading.Lock()


def warn_if_embedded(queue_name: str | None = None) -> bool:
    """Log, once per process and queue, that fire-and-forget workflows run in-process;
    whether the queue is embedded.

    Called where the work runs (the first fire-and-forget enqueue on the queue), not at
    start-up, so ``manage.py`` commands that run no work stay quiet.
    """
    queues = getattr(settings, "RQ_QUEUES", None)
    name = app_settings.RQ_QUEUE if queue_name is None else queue_name
    if not isinstance(queues, dict) or not isinstance(name, str) or not is_embedded(queues.get(name)):
        return False
    with _warned_lock:
        if name in _warned_queues:
            return True
        _warned_queues.add(name)
    logger.warning(
        "fire-and-forget workflows run synchronously at enqueue on an in-process Redis "
        "(embedded mode: queue %r is on fakeredis). Set REDIS_URL and run "
        "`manage.py rqworker --with-scheduler` to run them on a worker.",
        name,
    )
    return True

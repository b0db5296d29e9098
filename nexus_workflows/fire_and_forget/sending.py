"""Sending a fire-and-forget job: its options, its queue, and the dedupe on enqueue and at
commit (see :mod:`nexus_workflows.fire_and_forget`)."""

from __future__ import annotations

import copy
import logging
import math
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, transaction
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq.exceptions import DuplicateJobError
from rq.queue import Queue

from nexus_workflows.conf import app_settings
from nexus_workflows.deferred.registry import Workflow
from nexus_workflows.delays import parse_delay
from nexus_workflows.exceptions import (
    InvalidEnqueueOption,
    QueueUnavailable,
)
from nexus_workflows.fire_and_forget.cancelled import CANCELED, free_if_cancel_expired, sweep_cancelled
from nexus_workflows.fire_and_forget.embedded import warn_if_embedded
from nexus_workflows.fire_and_forget.job import RUN_SEALED_JOB
from nexus_workflows.fire_and_forget.job_ids import job_id_for
from nexus_workflows.fire_and_forget.sealing import seal_trigger
from nexus_workflows.limits import MAX_DELAY

logger = logging.getLogger("nexus_workflows.fire_and_forget")

FIRE_AND_FORGET_OPTIONS = frozenset({"queue", "job_timeout", "at_front", "delay"})
#: The key of a job's meta naming the enqueue call that created it (a random value).
CREATED_BY = "nexus_enqueue_call"


# --- options ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobOptions:
    queue: str
    job_timeout: int | None
    at_front: bool
    delay: timedelta


def configured_queues() -> list[str]:
    queues = getattr(settings, "RQ_QUEUES", None)
    return sorted(queues) if isinstance(queues, dict) else []


def parse_options(workflow: Workflow, options: dict[str, Any]) -> JobOptions:
    """Check ``enqueue``'s options for a fire-and-forget workflow; raises InvalidEnqueueOption."""
    kind = workflow.kind
    unknown = sorted(set(options) - FIRE_AND_FORGET_OPTIONS)
    if unknown:
        raise InvalidEnqueueOption(
            f"workflow {kind!r} is fire-and-forget; unknown option(s) {', '.join(unknown)}. "
            f"Allowed: {', '.join(sorted(FIRE_AND_FORGET_OPTIONS))}"
        )
    queue = options.get("queue", app_settings.RQ_QUEUE)
    known_queues = configured_queues()
    if not isinstance(queue, str) or queue not in known_queues:
        # What was passed is not repeated: a caller's mix-up may have put patient data there.
        got = "a str that is none of them" if isinstance(queue, str) else f"a {type(queue).__name__}"
        raise InvalidEnqueueOption(
            f"workflow {kind!r}: queue must be the name of a queue in RQ_QUEUES "
            f"({', '.join(known_queues) or 'none configured'}); got {got}"
        )
    job_timeout = options.get("job_timeout")
    if job_timeout is not None:
        job_timeout = _parse_job_timeout(kind, job_timeout)
    at_front = options.get("at_front", False)
    if not isinstance(at_front, bool):
        raise InvalidEnqueueOption(
            f"workflow {kind!r}: at_front must be True or False; got {type(at_front).__name__}"
        )
    return JobOptions(queue, job_timeout, at_front, parse_delay(kind, options.get("delay", 0)))


def _parse_job_timeout(kind: str, value: Any) -> int:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif type(value) is int or (type(value) is float and math.isfinite(value)):
        seconds = value  # an int is compared as it is: float() of a huge one overflows
    else:
        raise InvalidEnqueueOption(
            f"workflow {kind!r}: job_timeout must be a finite number of seconds or a timedelta; "
            f"got {type(value).__name__}"
        )
    if not 0 < seconds <= MAX_DELAY.total_seconds():
        raise InvalidEnqueueOption(
            f"workflow {kind!r}: job_timeout must be greater than 0 seconds and at most {MAX_DELAY.days} days"
        )
    return math.ceil(seconds)


def horizon_seconds() -> int:
    """How long a finished, failed or cancelled job keeps its id: RETENTION, as whole
    seconds."""
    return max(1, math.ceil(app_settings.RETENTION))


# --- queues and connections -----------------------------------------------------------------

# One queue object (and Redis client) per queue name, reused: RQ caches its Lua scripts
# per client object, so a new client per enqueue would grow that cache forever, and the
# queue object caches the server version RQ would otherwise ask for on every enqueue.
_queues: dict[str, Queue] = {}


def _forget_queues(*, setting: str, **kwargs: Any) -> None:
    if setting == "RQ_QUEUES":
        _queues.clear()


setting_changed.connect(_forget_queues)


def get_queue(name: str) -> Queue:
    """The django-rq queue ``name``, sending at once (this module handles transactions)."""
    queue = _queues.get(name)
    if queue is None:
        import django_rq

        built = django_rq.get_queue(name, commit_mode="auto")
        give_url_queue_a_retry(name, built.connection)
        queue = _queues.setdefault(name, built)
    return queue


#: Tries after the first that a ``URL`` queue's client makes, at once, when its queue
#: names no ``retry`` of its own: one resends a create whose answer was lost (it then finds
#: its own job), and bounds how long ``enqueue`` tries a Redis that is down (redis-py's
#: default, 10 tries with backoff, each reconnecting with tries of its own, held an
#: ``enqueue`` about 10 minutes on a server gone from the network: see the README).
URL_QUEUE_RETRIES = 1


def give_url_queue_a_retry(name: str, connection: redis.Redis) -> None:
    """Give the client of a queue configured with ``URL`` a retry: the ``retry`` in the
    queue's ``REDIS_CLIENT_KWARGS`` (``None``: none), else :data:`URL_QUEUE_RETRIES` tries
    without backoff.

    django-rq builds a ``URL`` queue with ``Redis.from_url``, whose connections get no
    ``retry`` and so never send a command again after a connection error: a lost answer to
    the create became ``QueueUnavailable``, where a create sent again finds its own job.
    django-rq hands ``REDIS_CLIENT_KWARGS`` only to ``HOST`` clients, so their ``retry`` is
    applied here. Other clients (``HOST``/``PORT``, which django-rq builds with redis-py's
    default or their own ``retry``; ``SENTINELS``; ``USE_REDIS_CACHE``) are left as
    configured; the cache's client is not the queue's to change."""
    queues = getattr(settings, "RQ_QUEUES", None)
    config = queues.get(name) if isinstance(queues, dict) else None
    if not isinstance(config, dict) or "URL" not in config or connection.get_retry() is not None:
        return
    client_kwargs = config.get("REDIS_CLIENT_KWARGS")
    if isinstance(client_kwargs, dict) and "retry" in client_kwargs:
        retry = client_kwargs["retry"]
    else:
        retry = Retry(NoBackoff(), URL_QUEUE_RETRIES)
    if isinstance(retry, Retry):
        # A copy, as redis.Redis(host=…) takes one: a Retry object keeps backoff state.
        connection.set_retry(copy.deepcopy(retry))


def describe_server(connection: redis.Redis) -> str:
    """Where a client connects, as ``host:port`` (or the socket path); never credentials."""
    kwargs = connection.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return str(kwargs["path"])
    if kwargs.get("host") is not None:
        return f"{kwargs['host']}:{kwargs.get('port', 6379)}"
    return "the configured Redis server"


@contextmanager
def _reachable(queue: Queue) -> Iterator[None]:
    """Turn a connection failure, or a server that refuses writes, into
    :class:`QueueUnavailable` naming host and port."""
    try:
        yield
    except redis.exceptions.ResponseError as error:
        # Reachable but refusing the write: out of memory (noeviction), a read-only replica
        # after a failover, failing persistence (MISCONF). Only the type is named: redis-py
        # quotes a failed pipeline command with its arguments (keys, the job id) in the text.
        # Redis refuses such a command before running it, but a script error may come late.
        raise QueueUnavailable(
            f"Redis at {describe_server(queue.connection)} refused the job for queue "
            f"{queue.name!r} ({type(error).__name__}: is it out of memory, a read-only replica, "
            "or unable to persist?). The job may exist; enqueueing the same trigger again once "
            "Redis accepts writes is safe (its dedupe key makes it one job)."
        ) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as error:
        reason = f"{type(error).__name__}: {error}"
        password = queue.connection.connection_pool.connection_kwargs.get("password")
        if password:
            reason = reason.replace(str(password), "***")
        raise QueueUnavailable(
            f"cannot reach Redis at {describe_server(queue.connection)} for queue {queue.name!r} "
            f"({reason}). The request may have reached Redis before the connection failed, so "
            "the job may exist; enqueueing the same trigger again is safe (its dedupe key "
            "makes it one job). Is the server running and REDIS_URL right?"
        ) from None
    except redis.exceptions.RedisError as error:
        # Anything else redis-py raises: a server that answers what is no Redis reply (an
        # HTTP port, a TLS-only endpoint: InvalidResponse, whose text quotes the answer).
        raise QueueUnavailable(
            f"Redis at {describe_server(queue.connection)} for queue {queue.name!r} did not "
            f"answer as a Redis server ({type(error).__name__}). Does REDIS_URL point at Redis "
            "(the right port, TLS through rediss://)? The job may exist if it did; enqueueing "
            "the same trigger again is safe (its dedupe key makes it one job)."
        ) from None


# --- enqueue ---------------------------------------------------------------------------------


def enqueue_job(
    workflow: Workflow, trigger_text: str, dedupe_key: str, options: dict[str, Any]
) -> str | None:
    """Send the job for ``enqueue``; returns its id, or ``None`` if a job with it exists.

    ``trigger_text`` is the checked trigger's JSON text and ``dedupe_key`` is already
    validated. See the module docstring for deduplication, the horizon and transactions.
    """
    job_options = parse_options(workflow, options)
    job_id = job_id_for(workflow.kind, dedupe_key)
    queue = get_queue(job_options.queue)
    in_transaction = transaction.get_connection(DEFAULT_DB_ALIAS).in_atomic_block
    if in_transaction:
        with _reachable(queue):
            exists = bool(queue.connection.exists(queue.job_class.key_for(job_id)))
            if exists and free_if_cancel_expired(queue, job_id, horizon_seconds()):
                exists = False  # cancelled more than the horizon ago: its key is free
        if exists:
            logger.debug("%s job not enqueued: a job with this dedupe key exists", workflow.kind)
            return None
    # Sealed here, not at commit, so that missing keys raise into the caller. (Outside a
    # transaction the duplicate check is the send itself, so a duplicate is sealed too.)
    trigger = seal_trigger(job_id, trigger_text)
    if in_transaction:

        def send_at_commit() -> None:
            _send_at_commit(queue, workflow.kind, trigger, job_id, job_options)

        transaction.on_commit(send_at_commit, using=DEFAULT_DB_ALIAS)
        return job_id
    with _reachable(queue):
        sent = _send(queue, workflow.kind, trigger, job_id, job_options)
    if not sent:
        logger.debug("%s job not enqueued: a job with this dedupe key exists", workflow.kind)
        return None
    return job_id


def _send(queue: Queue, kind: str, trigger: str, job_id: str, options: JobOptions) -> bool:
    """Create the job, its ``trigger`` sealed, unless its id exists (atomically); whether
    this call created it. A job cancelled more than the horizon ago does not count as
    existing (see :mod:`~nexus_workflows.fire_and_forget.cancelled`)."""
    horizon = horizon_seconds()
    # This call's mark, written into the job's meta by the same atomic create: a create that
    # redis-py sent again after a lost answer finds the job, and the mark says it is its own.
    call = secrets.token_hex(16)
    created = _create_or_find(queue, kind, trigger, job_id, options, horizon, call)
    # Once Redis has answered (an outage is not waited for twice): cancelled jobs whose keys
    # are never enqueued again, a bounded page at a time.
    sweep_cancelled(queue, horizon)
    return created


def _create_or_find(
    queue: Queue, kind: str, trigger: str, job_id: str, options: JobOptions, horizon: int, call: str
) -> bool:
    """Whether this call created the job: created now, found made by this very call (its
    answer was lost and the command sent again), or created once the cancelled job holding
    the id was deleted. ``False``: another enqueue's job holds the id."""
    try:
        _create(queue, kind, trigger, job_id, options, horizon, call)
        return True
    except DuplicateJobError:
        pass
    # Read only here: a new job costs nothing more, a duplicate one read (status and mark).
    status, meta = queue.connection.hmget(queue.job_class.key_for(job_id), "status", "meta")
    if _marked_by(queue, meta, call):
        return True
    if status is not None and status != CANCELED:
        return False
    if not free_if_cancel_expired(queue, job_id, horizon):
        return False
    try:
        _create(queue, kind, trigger, job_id, options, horizon, call)
    except DuplicateJobError:  # another enqueue won, unless the answer was lost again
        return _marked_by(queue, queue.connection.hget(queue.job_class.key_for(job_id), "meta"), call)
    return True


def _marked_by(queue: Queue, meta: Any, call: str) -> bool:
    """Whether a job's stored ``meta`` carries the mark of the enqueue call ``call``."""
    if not isinstance(meta, bytes) or not meta:  # RQ's connections answer bytes
        return False
    try:
        loaded = queue.serializer.loads(meta)
    except Exception:  # noqa: BLE001 - a meta this process cannot read is not its own
        return False
    return isinstance(loaded, dict) and loaded.get(CREATED_BY) == call


def _create(
    queue: Queue, kind: str, trigger: str, job_id: str, options: JobOptions, horizon: int, call: str
) -> None:
    """Create the job with RQ's ``unique=True``, marked as made by the enqueue call ``call``;
    raises ``DuplicateJobError`` if its id exists."""
    common: dict[str, Any] = {
        "job_id": job_id,
        "meta": {CREATED_BY: call},
        "unique": True,
        "result_ttl": horizon,
        "failure_ttl": horizon,
        # No TTL while queued or scheduled: the job must not vanish before it runs.
        "ttl": None,
        # RQ's default description is the call with its arguments, i.e. the trigger,
        # and it appears on list pages and in the worker's log.
        "description": f"workflow {kind}",
    }
    delay = options.delay
    if not queue.is_async:
        warn_if_embedded(queue.name)
    if delay and not queue.is_async:
        logger.warning("%s job: delay ignored, the embedded queue runs jobs at enqueue", kind)
        delay = timedelta(0)
    if delay:
        queue.enqueue_in(
            delay,
            RUN_SEALED_JOB,
            kind,
            trigger,
            job_timeout=options.job_timeout,
            at_front=options.at_front,
            **common,
        )
        logger.debug("%s job scheduled in %ss", kind, delay.total_seconds())
    else:
        queue.enqueue_call(
            RUN_SEALED_JOB,
            args=(kind, trigger),
            timeout=options.job_timeout,
            at_front=options.at_front,
            **common,
        )
        logger.debug("%s job enqueued on %s", kind, queue.name)


def _send_at_commit(queue: Queue, kind: str, trigger: str, job_id: str, options: JobOptions) -> None:
    # Runs after the caller's transaction committed: raising here would make a
    # committed transaction look failed, so every outcome is logged instead.
    try:
        with _reachable(queue):
            sent = _send(queue, kind, trigger, job_id, options)
    except QueueUnavailable as error:
        logger.error("%s job lost at commit: %s", kind, error)
    except Exception as error:  # noqa: BLE001 - must not raise into the caller's commit
        logger.error("%s job lost at commit: %s", kind, type(error).__name__)
    else:
        if not sent:
            logger.info("%s job dropped at commit: a job with this dedupe key already exists", kind)

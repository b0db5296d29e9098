"""Fire-and-forget workflows: one django-rq job per dedupe key, run once by an RQ worker.

A workflow registered without a ``retry_schedule`` is fire-and-forget. ``enqueue`` puts a
job on a django-rq queue; an RQ worker (``manage.py rqworker``) runs :func:`run_job`,
which looks the workflow up in the worker's own registry and calls ``prepare(trigger)``
once, with no retry.

Deduplication. The job id is ``<kind>__<dedupe key>`` (see :func:`job_id_for`) and the job
is created with RQ's ``unique=True``: one atomic Lua script checks that no job hash with
that id exists and creates it, so two processes enqueueing the same key at the same
instant produce one job. ``enqueue`` returns the job id, or ``None`` while a job with that
id still exists in Redis: queued, scheduled, running, finished or failed.

Dedupe horizon. Finished and failed jobs keep their hash for ``NEXUS_WORKFLOWS['RETENTION']``
seconds (both ``result_ttl`` and ``failure_ttl`` are set to it, overriding RQ's 500 s and
one year), so the horizon is the same as for deferred work. Queued and scheduled jobs get
no TTL: they never expire before they run, and a running job's hash has none either.
Deleting a job in django-rq's admin frees its key at once.

Transactions. Inside ``transaction.atomic()`` (on the default database, as in django-rq)
the job is sent when the outermost transaction commits, and not at all if it rolls back.
``enqueue`` then checks at once whether a job with the id exists (which also checks that
Redis is reachable) and returns ``None`` if it does, else the job id the job will have.
If by commit time a job with that id has appeared (another process won, or the same key
was enqueued twice in the transaction), the new one is dropped and an INFO line logged;
nothing ever raises into the caller's commit.

Embedded mode. With a queue on the in-process fakeredis server (see
:mod:`nexus_workflows.embedded`), the queue is synchronous: the job runs through RQ during
``enqueue`` (or at commit), with the same dedupe rules, and a ``delay`` is ignored.

Patient data. Triggers travel in the job's arguments and are shown on the job's page in
django-rq's admin, as deferred triggers are in the database. Job ids carry the dedupe key,
so dedupe keys must be opaque identifiers (a visit id), never a name or a phone number.
Log lines name the kind only, and a failing ``prepare``'s message is kept out of the
worker's log (see :class:`~nexus_workflows.exceptions.JobFailed`).
"""

from __future__ import annotations

import logging
import math
import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, transaction
from rq import get_current_job
from rq.exceptions import DuplicateJobError
from rq.queue import Queue

from .conf import app_settings
from .delays import parse_delay
from .embedded import warn_if_embedded
from .exceptions import InvalidEnqueueOption, JobFailed, QueueUnavailable, UnknownWorkflow, WorkflowError
from .history import describe_error
from .limits import MAX_DELAY
from .registry import Workflow, registry

logger = logging.getLogger(__name__)

FIRE_AND_FORGET_OPTIONS = frozenset({"queue", "job_timeout", "at_front", "delay"})

# Separates the kind from the dedupe key in a job id; kinds may not contain it.
SEPARATOR = "__"
# Dedupe keys of this form are used in the job id as they are. Others are escaped (see
# job_id_for); the first character is never '_', so a kind ending in '_' cannot make
# two (kind, key) pairs share an id.
_PLAIN_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_KEPT_WHEN_ESCAPING = re.compile(r"[A-Za-z0-9_]")
_ESCAPE = "-"


# --- job ids ------------------------------------------------------------------------------


def job_id_for(kind: str, dedupe_key: str) -> str:
    """The RQ job id of a fire-and-forget workflow: ``<kind>__<dedupe key>``.

    RQ job ids may only contain letters, digits, '_' and '-'. A key made of those that
    starts with a letter or digit (``"123"``, a UUID) is used as it is. Any other key is
    escaped, deterministically and reversibly: the escaped form starts with '-', letters,
    digits and '_' stay, and every other character becomes '-' plus two lowercase hex
    digits per UTF-8 byte. So ``"visit/7"`` → ``"-visit-2f7"`` and ``"-5"`` → ``"--2d5"``.
    """
    if _PLAIN_KEY.fullmatch(dedupe_key):
        return f"{kind}{SEPARATOR}{dedupe_key}"
    escaped = "".join(
        char
        if _KEPT_WHEN_ESCAPING.fullmatch(char)
        else "".join(f"{_ESCAPE}{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
        for char in dedupe_key
    )
    return f"{kind}{SEPARATOR}{_ESCAPE}{escaped}"


def split_job_id(job_id: str) -> tuple[str, str]:
    """The ``(kind, dedupe key)`` a job id was made from; the inverse of :func:`job_id_for`.

    Raises ``ValueError`` for an id that :func:`job_id_for` cannot have made.
    """
    start = job_id.find(SEPARATOR)
    if start < 1:
        raise ValueError("not a fire-and-forget job id: no '__' after the kind")
    # A kind may end in one '_' (it cannot contain '__') and a key part never starts
    # with '_', so the key starts after the whole run of underscores.
    end = start + len(SEPARATOR)
    while end < len(job_id) and job_id[end] == "_":
        end += 1
    kind, key_part = job_id[: end - len(SEPARATOR)], job_id[end:]
    if _PLAIN_KEY.fullmatch(key_part):
        return kind, key_part
    if not key_part.startswith(_ESCAPE):
        raise ValueError("not a fire-and-forget job id: the dedupe key part is malformed")
    raw = bytearray()
    position = 1
    while position < len(key_part):
        char = key_part[position]
        if char == _ESCAPE:
            hex_digits = key_part[position + 1 : position + 3]
            if not re.fullmatch(r"[0-9a-f]{2}", hex_digits):
                raise ValueError("not a fire-and-forget job id: bad escape in the dedupe key part")
            raw.append(int(hex_digits, 16))
            position += 3
        elif _KEPT_WHEN_ESCAPING.fullmatch(char):
            raw.extend(char.encode())
            position += 1
        else:
            raise ValueError("not a fire-and-forget job id: bad character in the dedupe key part")
    key = raw.decode("utf-8", "surrogatepass")
    if job_id_for(kind, key) != job_id:  # e.g. an escaped form of a plain key
        raise ValueError("not a fire-and-forget job id: the dedupe key part is not in canonical form")
    return kind, key


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
        raise InvalidEnqueueOption(
            f"workflow {kind!r}: queue must be the name of a queue in RQ_QUEUES "
            f"({', '.join(known_queues) or 'none configured'}); got {queue!r:.80}"
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
            f"workflow {kind!r}: job_timeout must be a number of seconds or a timedelta; "
            f"got {type(value).__name__}"
        )
    if not 0 < seconds <= MAX_DELAY.total_seconds():
        raise InvalidEnqueueOption(
            f"workflow {kind!r}: job_timeout must be greater than 0 seconds and at most "
            f"{MAX_DELAY.days} days"
        )
    return math.ceil(seconds)


def horizon_seconds() -> int:
    """How long a finished or failed job keeps its id: RETENTION, as whole seconds."""
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

        queue = _queues.setdefault(name, django_rq.get_queue(name, commit_mode="auto"))
    return queue


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
    """Turn a connection failure into :class:`QueueUnavailable` naming host and port."""
    try:
        yield
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


# --- enqueue ---------------------------------------------------------------------------------


def enqueue_job(workflow: Workflow, trigger: Any, dedupe_key: str, options: dict[str, Any]) -> str | None:
    """Send the job for ``enqueue``; returns its id, or ``None`` if a job with it exists.

    ``trigger`` is already JSON-safe and ``dedupe_key`` already validated. See the module
    docstring for deduplication, the horizon and transactions.
    """
    job_options = parse_options(workflow, options)
    job_id = job_id_for(workflow.kind, dedupe_key)
    queue = get_queue(job_options.queue)
    if transaction.get_connection(DEFAULT_DB_ALIAS).in_atomic_block:
        with _reachable(queue):
            exists = queue.connection.exists(queue.job_class.key_for(job_id))
        if exists:
            logger.debug("%s job not enqueued: a job with this dedupe key exists", workflow.kind)
            return None

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


def _send(queue: Queue, kind: str, trigger: Any, job_id: str, options: JobOptions) -> bool:
    """Create the job unless its id exists (atomically); whether it was created."""
    horizon = horizon_seconds()
    common: dict[str, Any] = {
        "job_id": job_id,
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
    try:
        if delay:
            queue.enqueue_in(
                delay,
                run_job,
                kind,
                trigger,
                job_timeout=options.job_timeout,
                at_front=options.at_front,
                **common,
            )
            logger.debug("%s job scheduled in %ss", kind, delay.total_seconds())
        else:
            queue.enqueue_call(
                run_job,
                args=(kind, trigger),
                timeout=options.job_timeout,
                at_front=options.at_front,
                **common,
            )
            logger.debug("%s job enqueued on %s", kind, queue.name)
    except DuplicateJobError:
        return False
    return True


def _send_at_commit(queue: Queue, kind: str, trigger: Any, job_id: str, options: JobOptions) -> None:
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


# --- the job ---------------------------------------------------------------------------------


def run_job(kind: str, trigger: Any) -> None:
    """What RQ runs: ``prepare(trigger)`` of the workflow registered as ``kind`` here.

    The worker's registry is filled by autodiscovery at Django start-up, so the job
    finds every workflow of the project's installed apps. Returns nothing: RQ would
    store a return value in Redis, and it may hold patient data.
    """
    try:
        workflow = registry.get(kind)
    except UnknownWorkflow as error:
        raise UnknownWorkflow(
            f"fire-and-forget job: {error}. The worker must run the same project code as the "
            "process that enqueued the job (is the app defining it in INSTALLED_APPS?)"
        ) from None
    if workflow.is_deferred:
        raise WorkflowError(
            f"fire-and-forget job: workflow {kind!r} is registered with a retry schedule in this "
            "worker, so it is deferred and runs in runworkflows, not on RQ; the job was not run"
        )
    try:
        workflow.call_prepare(trigger)
    except Exception as error:  # noqa: BLE001 - consumer code may raise anything
        raise _job_failed(kind, error) from None
    logger.debug("%s job finished", kind)


def _job_failed(kind: str, error: Exception) -> JobFailed:
    # The original message goes to the job's meta (shown on its admin page, stored in
    # Redis like the trigger); the exception RQ logs names only the type and the frames.
    job = get_current_job()
    if job is not None:
        job.meta["error"] = describe_error(error)
        job.save_meta()
    frames = "".join(traceback.format_tb(error.__traceback__))
    logger.warning("%s job failed: %s", kind, type(error).__name__)
    return JobFailed(
        f"workflow {kind!r}: prepare raised {type(error).__name__}. Its message is kept out of "
        "logs (it may carry patient data) and stored in this job's meta['error']. Where it was "
        f"raised:\n{frames}"
    )

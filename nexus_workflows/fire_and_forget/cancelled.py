"""Jobs cancelled with RQ's ``job.cancel()``: their key is held for the horizon, then free.

RQ gives a cancelled job no TTL (finished and failed jobs get ``result_ttl`` and
``failure_ttl``; a stopped one is failed), so its hash, and with it its id, would stay in
Redis until someone deleted it: every later ``enqueue`` of its dedupe key would be refused,
for ever. A cancelled job is held like the others instead, for ``RETENTION`` seconds from
its cancel (its score in RQ's canceled registry: whole seconds by the cancelling host's
clock, compared here with Redis's). An ``enqueue`` that finds one older than that deletes
it, as django-rq's Delete would, and creates the new job.

A key that is never enqueued again would keep its cancelled job in Redis for ever, so
:func:`sweep_cancelled` also deletes, from time to time, the workflow jobs of a queue
cancelled more than the horizon ago: an ``enqueue`` on the queue runs it at most once a
minute per process (once a horizon, if shorter), at the cost of one read of the canceled
registry.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import cast

import redis
from rq.executions import ExecutionRegistry
from rq.job import JobStatus
from rq.queue import Queue
from rq.registry import CanceledJobRegistry
from rq.results import Result

logger = logging.getLogger("nexus_workflows.fire_and_forget")

CANCELED = JobStatus.CANCELED.value.encode()
#: At most this many seconds between two sweeps of one queue by one process.
SWEEP_EVERY = 60.0
#: Cancelled jobs read per page, and pages per sweep: a longer backlog goes over the next
#: sweeps.
SWEEP_BATCH = 100
SWEEP_PAGES = 10

_last_sweeps: dict[str, float] = {}  # queue name -> time.monotonic() of its last sweep
_sweeping = threading.Lock()


def sweep_cancelled(queue: Queue, horizon: int) -> int:
    """Delete the workflow jobs of ``queue`` cancelled more than ``horizon`` seconds ago,
    unless this process swept the queue less than ``min(SWEEP_EVERY, horizon)`` seconds
    ago; how many were deleted. Each goes through :func:`free_if_cancel_expired`, which
    decides by Redis's clock. Jobs that are not a workflow's are left alone. Never raises:
    a sweep that fails is said at DEBUG and tried again at the next interval."""
    now = time.monotonic()
    with _sweeping:
        last = _last_sweeps.get(queue.name)
        if last is not None and now - last < min(SWEEP_EVERY, horizon):
            return 0
        _last_sweeps[queue.name] = now
    try:
        return _sweep(queue, horizon)
    except Exception as error:  # noqa: BLE001 - housekeeping must not fail the enqueue
        logger.debug("sweep of cancelled jobs of queue %r failed (%s)", queue.name, type(error).__name__)
        return 0


def _sweep(queue: Queue, horizon: int) -> int:
    connection = queue.connection
    registry = CanceledJobRegistry(queue.name, connection=connection).key
    # The host's clock only narrows the read; free_if_cancel_expired decides by Redis's.
    cutoff = time.time() - horizon
    kept, deleted = 0, 0
    # Page on past what stays (other jobs, running ones): they never starve the sweep.
    for _ in range(SWEEP_PAGES):
        ids = connection.zrangebyscore(registry, "-inf", cutoff, start=kept, num=SWEEP_BATCH)
        for raw_id in ids:
            if _delete_if_ours_and_expired(queue, cast(bytes, raw_id).decode(), horizon):
                deleted += 1
            else:
                kept += 1
        if len(ids) < SWEEP_BATCH:
            break
    if deleted:
        logger.debug("queue %r: %d cancelled job(s) past the horizon deleted", queue.name, deleted)
    return deleted


def _delete_if_ours_and_expired(queue: Queue, job_id: str, horizon: int) -> bool:
    """Whether the cancelled job ``job_id``, a workflow's, was deleted here."""
    from nexus_workflows.fire_and_forget.job_ids import split_job_id

    try:
        kind, _ = split_job_id(job_id)
    except ValueError:
        return False  # not a workflow's job id: no round trip
    key = queue.job_class.key_for(job_id)
    if queue.connection.hget(key, "description") != f"workflow {kind}".encode():
        return False  # another job of the project's whose id looks like one
    return free_if_cancel_expired(queue, job_id, horizon) and not queue.connection.exists(key)


def free_if_cancel_expired(queue: Queue, job_id: str, horizon: int) -> bool:
    """Delete the job ``job_id`` if RQ cancelled it at least ``horizon`` seconds ago
    (by Redis's clock) and no execution of it is alive. Returns whether its key may be
    free now, so that creating the job is worth another try: deleted here, gone already,
    or changed while it was looked at (``WATCH``: nothing is deleted then, and RQ's
    atomic create decides). ``False``: a job holds the key.
    """
    connection = queue.connection
    key = queue.job_class.key_for(job_id)
    # One read for the common case, a duplicate of a job that is not cancelled; the
    # status is read again under WATCH below before anything is written.
    status = connection.hget(key, "status")
    if status is None:
        return True  # expired or deleted since the key was found taken
    if status != CANCELED:
        return False
    # A job cancelled while it runs keeps running (cancel does not stop its work-horse),
    # and its execution stays registered, heart-beaten, until it ends.
    executions = ExecutionRegistry(job_id, connection=connection).key
    with connection.pipeline() as pipe:
        try:
            pipe.watch(key, executions)
            status, origin = pipe.hmget(key, "status", "origin")
            if status is None:
                return True
            if status != CANCELED or origin is None:
                return False
            # Not watched: another job's cancel must not fail this one. A change to this
            # job's entry comes with a change to its hash, which is.
            # RQ's connections answer bytes (it refuses decode_responses).
            canceled = CanceledJobRegistry(cast(bytes, origin).decode(), connection=connection).key
            seconds, microseconds = pipe.time()
            now = seconds + microseconds / 1_000_000
            cancelled_at = pipe.zscore(canceled, job_id)
            if cancelled_at is None:
                # Cancelled without being registered (the registry entry was removed): the
                # horizon starts now.
                pipe.multi()
                pipe.zadd(canceled, {job_id: now}, nx=True)
                pipe.execute()
                return False
            if now < cancelled_at + horizon or pipe.zcount(executions, f"({now}", "+inf"):
                return False
            # What RQ's job.delete() would remove of such a job (cancel took it off its queue;
            # these jobs have no dependencies, group or rate limit), written here rather than
            # by job.delete(), whose own reads would race with other enqueues of the key.
            pipe.multi()
            pipe.delete(key, Result.get_key(job_id), executions)
            pipe.zrem(canceled, job_id)
            pipe.execute()
        except redis.WatchError:
            pass  # the job changed meanwhile: RQ's atomic create decides
    return True

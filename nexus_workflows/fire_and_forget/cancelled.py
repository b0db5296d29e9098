"""Jobs cancelled with RQ's ``job.cancel()``: their key is held for the horizon, then free.

RQ gives a cancelled job no TTL (finished and failed jobs get ``result_ttl`` and
``failure_ttl``; a stopped one is failed), so its hash, and with it its id, would stay in
Redis until someone deleted it: every later ``enqueue`` of its dedupe key would be refused,
for ever. A cancelled job is held like the others instead, for ``RETENTION`` seconds from
its cancel (its score in RQ's canceled registry: whole seconds by the cancelling host's
clock, compared here with Redis's). An ``enqueue`` that finds one older than that deletes
it, as django-rq's Delete would, and creates the new job.
"""

from __future__ import annotations

from typing import cast

import redis
from rq.executions import ExecutionRegistry
from rq.job import JobStatus
from rq.queue import Queue
from rq.registry import CanceledJobRegistry
from rq.results import Result

CANCELED = JobStatus.CANCELED.value.encode()


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

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
cancelled more than the horizon ago, and the canceled registry's entries of workflow job ids
whose job is gone. An ``enqueue`` on the queue runs it at most once a minute per process
(once a horizon, if shorter), and each run takes one page of the registry (``SWEEP_BATCH``
entries) in two round trips: a backlog goes over the next enqueues, each taking the next
page at once, from where the last one stopped.

A page starts past the entries this process's pass has read and left. If another process
removed some of those (or of the page being swept) meanwhile, it starts past entries no one
read yet; the pass then reaches the end sooner, and the next one, from the top, reads them.
No entry is skipped by every pass: a skip needs a removal ahead of the entry, and only
finitely many entries ever come ahead of one (a cancel is scored with its time, after the
entries already there, give or take the cancelling hosts' clocks; an entry removed and
added again comes back at the end).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import cast

import redis
from rq.executions import ExecutionRegistry
from rq.job import JobStatus
from rq.queue import Queue
from rq.registry import CanceledJobRegistry
from rq.results import Result

logger = logging.getLogger("nexus_workflows.fire_and_forget")

CANCELED = JobStatus.CANCELED.value.encode()
#: At most this many seconds between two sweeps of one queue by one process, when the last
#: one reached the end of the registry.
SWEEP_EVERY = 60.0
#: Canceled-registry entries one sweep reads: all the work one ``enqueue`` does for it.
SWEEP_BATCH = 100

# Decides each entry in Redis, atomically (no WATCH to lose), by Redis's clock. KEYS[1]: the
# queue's canceled registry; then per job its hash, results and executions. ARGV[1]: the
# horizon; ARGV[2]: the queue's name; then per job its id and its workflow's description.
# An entry whose hash is gone is removed; a job is deleted as free_if_cancel_expired would.
SWEEP_SCRIPT = """
-- Writes after TIME (a non-deterministic command): Redis 3.2-4 refuse them unless the script
-- replicates its effects, which Redis 5 and later do anyway (there the call is a no-op).
if redis.replicate_commands then redis.replicate_commands() end
local time = redis.call('TIME')
local now = tonumber(time[1]) + tonumber(time[2]) / 1000000
local horizon = tonumber(ARGV[1])
local deleted, orphans = 0, 0
for i = 0, (#KEYS - 1) / 3 - 1 do
    local job, results, executions = KEYS[2 + 3 * i], KEYS[3 + 3 * i], KEYS[4 + 3 * i]
    local id, description = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
    local cancelled_at = redis.call('ZSCORE', KEYS[1], id)
    local fields = redis.call('HMGET', job, 'status', 'description', 'origin')
    if cancelled_at and redis.call('EXISTS', job) == 0 then
        redis.call('ZREM', KEYS[1], id)
        orphans = orphans + 1
    elseif cancelled_at and fields[1] == 'canceled' and fields[2] == description
        and fields[3] == ARGV[2] and tonumber(cancelled_at) + horizon <= now
        and redis.call('ZCOUNT', executions, '(' .. now, '+inf') == 0 then
        redis.call('DEL', job, results, executions)
        redis.call('ZREM', KEYS[1], id)
        deleted = deleted + 1
    end
end
return {deleted, orphans}
"""


@dataclass
class _Pass:
    """One process's way through one queue's canceled registry."""

    last: float | None = None  # time.monotonic() of the last sweep that reached the end
    offset: int = 0  # entries before the next page that stay (other jobs, running ones)
    more: bool = False  # the last page was full: the next one is due at once
    busy: bool = False  # a thread of this process is sweeping the queue

    def due(self, now: float, horizon: int) -> bool:
        if self.busy:
            return False
        return self.more or self.last is None or now - self.last >= min(SWEEP_EVERY, horizon)

    def start(self) -> int:
        self.busy = True
        return self.offset

    def page_done(self, now: float, read: int, removed: int) -> None:
        """A page of ``read`` entries swept, ``removed`` of them gone: the next page follows
        at the next enqueue, or, at the end of the registry, a new pass after the interval."""
        self.busy = False
        if read < SWEEP_BATCH:
            self.last, self.offset, self.more = now, 0, False
        else:
            self.offset, self.more = self.offset + read - removed, True

    def failed(self, now: float) -> None:
        self.busy, self.last, self.offset, self.more = False, now, 0, False


_passes: dict[str, _Pass] = {}  # queue name -> this process's pass through its registry
_sweeping = threading.Lock()


def sweep_cancelled(queue: Queue, horizon: int) -> int:
    """Sweep one page of ``queue``'s canceled registry if one is due (see the module
    docstring); how many jobs were deleted. Workflow jobs cancelled more than ``horizon``
    seconds ago are deleted (by Redis's clock, unless an execution is alive), entries of
    workflow job ids whose hash is gone are removed, and everything else is left alone.
    Never raises: a sweep that fails is said at DEBUG and tried again at the next interval."""
    now = time.monotonic()
    with _sweeping:
        sweep = _passes.setdefault(queue.name, _Pass())
        if not sweep.due(now, horizon):
            return 0
        offset = sweep.start()
    read = deleted = orphans = -1  # -1: the page failed (or was interrupted)
    try:
        read, deleted, orphans = _sweep_page(queue, horizon, offset)
    except Exception as error:  # noqa: BLE001 - housekeeping must not fail the enqueue
        logger.debug("sweep of cancelled jobs of queue %r failed (%s)", queue.name, type(error).__name__)
    finally:
        # Also after an interrupt: a pass left busy would never sweep again in this process.
        with _sweeping:
            if read < 0:
                sweep.failed(now)
            else:
                sweep.page_done(now, read, deleted + orphans)
    if read < 0:
        return 0
    if deleted or orphans:
        logger.debug(
            "queue %r: %d cancelled job(s) past the horizon deleted, %d entries of gone jobs removed",
            queue.name,
            deleted,
            orphans,
        )
    return deleted


def _sweep_page(queue: Queue, horizon: int, offset: int) -> tuple[int, int, int]:
    """Entries read, jobs deleted and entries of gone jobs removed, in two round trips."""
    from nexus_workflows.fire_and_forget.job_ids import split_job_id

    connection = queue.connection
    registry = CanceledJobRegistry(queue.name, connection=connection).key
    # The host's clock only narrows the read; the script decides by Redis's.
    cutoff = time.time() - horizon
    raw_ids = connection.zrangebyscore(registry, "-inf", cutoff, start=offset, num=SWEEP_BATCH)
    keys, args = [registry], [str(horizon), queue.name]
    for raw_id in cast(list[bytes], raw_ids):
        job_id = raw_id.decode()
        try:
            kind, _ = split_job_id(job_id)
        except ValueError:
            continue  # not a workflow's job id: left alone
        executions = ExecutionRegistry(job_id, connection=connection).key
        keys += [queue.job_class.key_for(job_id), Result.get_key(job_id), executions]
        args += [job_id, f"workflow {kind}"]
    if len(keys) == 1:
        return len(raw_ids), 0, 0
    deleted, orphans = connection.register_script(SWEEP_SCRIPT)(keys=keys, args=args)
    return len(raw_ids), int(deleted), int(orphans)


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

"""Fire-and-forget workflows: one django-rq job per dedupe key, run once by an RQ worker.

The package: :mod:`.job_ids` (the job id of a kind and key), :mod:`.sending` (options,
queues, enqueue and the dedupe at commit), :mod:`.sealing` (the trigger and error message
through Redis, encrypted), :mod:`.job` (the body a worker runs), :mod:`.cancelled` (when a
cancelled job's key is free again) and :mod:`.embedded` (the in-process Redis of the
embedded mode).

A workflow registered without a ``retry_schedule`` is fire-and-forget. ``enqueue`` puts a
job on a django-rq queue; an RQ worker (``manage.py rqworker``) runs
:func:`run_sealed_job`, which opens the trigger, looks the workflow up in the worker's own
registry and calls ``prepare(trigger)`` once, with no retry.

Deduplication. The job id is ``<kind>__<dedupe key>`` (see :func:`job_id_for`) and the job
is created with RQ's ``unique=True``: one atomic Lua script checks that no job hash with
that id exists and creates it, so two processes enqueueing the same key at the same
instant produce one job. ``enqueue`` returns the job id, or ``None`` while a job with that
id still exists in Redis: queued, scheduled, running, finished, failed (stopped
included) or cancelled within the horizon. The create also writes a random mark of the
enqueue call into the job's meta (``CREATED_BY``): a create that redis-py sent again after
a lost answer, and that so finds the job its first try made, still returns the job id.

Dedupe horizon. Finished and failed jobs keep their hash for ``NEXUS_WORKFLOWS['RETENTION']``
seconds (both ``result_ttl`` and ``failure_ttl`` are set to it, overriding RQ's 500 s and
one year), so the horizon is the same as for deferred work. Queued and scheduled jobs get
no TTL: they never expire before they run, and a running job's hash has none either.
A job cancelled with RQ's ``job.cancel()`` gets no TTL from RQ; it holds its key for the
same horizon from its cancel, then an enqueue of its key replaces it, or a sweep at an
enqueue of another key deletes it (see :mod:`~nexus_workflows.fire_and_forget.cancelled`).
Deleting a job in django-rq's admin frees its key at once.

Transactions. Inside ``transaction.atomic()`` (on the default database, as in django-rq)
the job is sent when the outermost transaction commits, and not at all if it rolls back.
``enqueue`` then checks at once whether a job with the id exists (which also checks that
Redis is reachable) and returns ``None`` if it does, else the job id the job will have.
If by commit time a job with that id has appeared (another process won, or the same key
was enqueued twice in the transaction), the new one is dropped and an INFO line logged;
nothing ever raises into the caller's commit.

Embedded mode. With a queue on the in-process fakeredis server (see
:mod:`nexus_workflows.fire_and_forget.embedded`), the queue is synchronous: the job runs through RQ during
``enqueue`` (or at commit), with the same dedupe rules, and a ``delay`` is ignored.

Patient data. A job's trigger travels sealed in its arguments, and a failing
``prepare``'s message is sealed into its meta (see :mod:`~nexus_workflows.fire_and_forget.sealing`):
Redis, django-rq's pages and RQ's log records see ciphertext, and a person sees either
only on the admin's reveal page, with a permission, audited (:mod:`nexus_workflows.admin.jobs`).
Job ids carry the dedupe key, so dedupe keys must be opaque identifiers (a visit id), never
a name or a phone number. Log lines name the kind only (see
:class:`~nexus_workflows.exceptions.JobFailed`).
"""

from nexus_workflows.fire_and_forget.job import run_job, run_sealed_job
from nexus_workflows.fire_and_forget.job_ids import SEPARATOR, job_id_for, split_job_id
from nexus_workflows.fire_and_forget.sending import (
    FIRE_AND_FORGET_OPTIONS,
    JobOptions,
    configured_queues,
    describe_server,
    enqueue_job,
    get_queue,
    horizon_seconds,
    parse_options,
)

__all__ = [
    "FIRE_AND_FORGET_OPTIONS",
    "SEPARATOR",
    "JobOptions",
    "configured_queues",
    "describe_server",
    "enqueue_job",
    "get_queue",
    "horizon_seconds",
    "job_id_for",
    "parse_options",
    "run_job",
    "run_sealed_job",
    "split_job_id",
]

"""The job body an RQ worker runs: open the sealed trigger, look the workflow up and call
``prepare(trigger)`` once; and, for the admin's reveal page, what a job holds."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from django.urls import NoReverseMatch, reverse
from rq import get_current_job
from rq.job import Job, JobStatus

from nexus_workflows.deferred.history import describe_error
from nexus_workflows.deferred.registry import registry
from nexus_workflows.exceptions import (
    JobFailed,
    UnknownWorkflow,
    WorkflowError,
)
from nexus_workflows.fire_and_forget.sealing import open_error, open_trigger, seal_error

logger = logging.getLogger("nexus_workflows.fire_and_forget")

# The job body by its stable path: the package re-exports it, so a move of the module
# never strands jobs already in Redis.
RUN_SEALED_JOB = "nexus_workflows.fire_and_forget.run_sealed_job"
# What jobs sent before triggers were sealed name; it still runs them.
RUN_JOB_UNSEALED = "nexus_workflows.fire_and_forget.run_job"
# Where a failed prepare's message is kept, sealed, in the job's meta.
SEALED_ERROR = "sealed_error"

#: The admin's page that opens a job's sealed trigger and error (nexus_workflows.admin.jobs).
REVEAL_URL_NAME = "nexus_workflows_deferredwork_job_reveal"


# --- the job ---------------------------------------------------------------------------------


def run_sealed_job(kind: str, sealed_trigger: str) -> None:
    """What RQ runs: ``prepare(trigger)`` of the workflow registered as ``kind`` here, with
    the trigger sealed for this job (see :mod:`~nexus_workflows.fire_and_forget.sealing`).

    The worker's registry is filled by autodiscovery at Django start-up, so the job
    finds every workflow of the project's installed apps. Returns nothing: RQ would
    store a return value in Redis, and it may hold patient data.
    """
    job = get_current_job()
    if job is None:
        raise WorkflowError(f"fire-and-forget job of {kind!r}: run_sealed_job runs only as an RQ job")
    _run(kind, open_trigger(job.id, sealed_trigger))


def run_job(kind: str, trigger: Any) -> None:
    """The job body of jobs sent before triggers were sealed, run as they were sent."""
    _run(kind, trigger)


def _run(kind: str, trigger: Any) -> None:
    try:
        workflow = registry.get(kind)
    except UnknownWorkflow:
        # The job's kind was registered where it was enqueued: naming it is safe.
        raise UnknownWorkflow(
            f"fire-and-forget job: no workflow is registered for kind {kind!r:.120} in this "
            f"worker; registered kinds: {', '.join(registry.kinds()) or 'none'}. The worker must "
            "run the same project code as the process that enqueued the job (is the app defining "
            "it in INSTALLED_APPS?)"
        ) from None
    if workflow.is_deferred:
        raise WorkflowError(
            f"fire-and-forget job: workflow {kind!r} is registered with a retry schedule in this "
            "worker, so it is deferred and runs in runworkflows, not on RQ; the job was not run"
        )
    failed: BaseException | None = None
    try:
        workflow.call_prepare(trigger)
    except BaseException as error:  # noqa: BLE001 - consumer code may raise anything
        # SystemExit, KeyboardInterrupt or asyncio's CancelledError too: RQ catches every
        # exception of a job and would log and store their messages as they are.
        failed = error
    # Handled after the except block: anything raised while handling it (sealing, Redis,
    # the job timeout's alarm) would otherwise carry the error as its context, and RQ
    # logs and stores the whole chain, message included.
    if failed is not None:
        raise _job_failed(kind, failed) from None
    _forget_earlier_error(kind)
    logger.debug("%s job finished", kind)


def _forget_earlier_error(kind: str) -> None:
    """A failed job requeued (from django-rq's pages) that now succeeded: the error sealed
    by its failed run is not this run's, and its reveal page would show it as the job's.

    ``prepare`` has returned: a write that fails here (Redis gone, out of memory, a
    timeout) must not fail the job, which RQ would then record as failed though its work
    was done (it is not run again). It is logged, by type only; :func:`error_of` shows no
    error for a finished job, whatever its meta still holds."""
    job = get_current_job()
    if job is None or SEALED_ERROR not in job.meta:
        return
    del job.meta[SEALED_ERROR]
    try:
        job.save_meta()
    except Exception as error:  # noqa: BLE001 - the job succeeded; only this write failed
        logger.error(
            "%s job finished, but its earlier run's error could not be removed from the job (%s); "
            "the job is recorded as finished",
            kind,
            type(error).__name__,
        )


def _job_failed(kind: str, error: BaseException) -> JobFailed:
    # The original message is sealed into the job's meta (opened only by the admin's
    # reveal page); the exception RQ logs names only the type and the frames.
    job = get_current_job()
    if job is not None:
        try:
            job.meta[SEALED_ERROR] = seal_error(job.id, describe_error(error))
            job.meta["reveal"] = _reveal_path(job.origin, job.id)  # shown on django-rq's job page
            job.save_meta()
        except Exception as sealing_error:  # noqa: BLE001 - the job must still fail as JobFailed
            logger.error(
                "%s job: its error message could not be sealed into the job (%s); it is not kept",
                kind,
                type(sealing_error).__name__,
            )
    frames = "".join(traceback.format_tb(error.__traceback__))
    logger.warning("%s job failed: %s", kind, type(error).__name__)
    return JobFailed(
        f"workflow {kind!r}: prepare raised {type(error).__name__}. Its message is kept out of "
        "logs (it may carry patient data) and sealed into this job's meta['sealed_error'], "
        f"shown by the admin's reveal page for the job. Where it was raised:\n{frames}"
    )


def _reveal_path(queue_name: str, job_id: str) -> str | None:
    """Where the job's reveal page is, or ``None`` where the project mounts no admin."""
    try:
        return reverse(f"admin:{REVEAL_URL_NAME}", args=[queue_name, job_id])
    except NoReverseMatch:
        return None


# --- what a job holds, for the reveal page ---------------------------------------------------


def is_workflow_job(job: Job) -> bool:
    """Whether ``job`` is a fire-and-forget workflow's (sealed, or sent before sealing)."""
    return job.func_name in (RUN_SEALED_JOB, RUN_JOB_UNSEALED)


def trigger_of(job: Job) -> Any:
    """The trigger ``prepare`` receives; :class:`SealedDataUnreadable` if no key opens it."""
    if job.func_name == RUN_SEALED_JOB:
        return open_trigger(job.id, job.args[1])
    return job.args[1]  # sent before sealing: in clear


def error_of(job: Job) -> str | None:
    """A failed ``prepare``'s message, ``None`` if the job has not failed that way;
    :class:`SealedDataUnreadable` if no key opens it. A finished job has none: an error
    still in its meta is an earlier run's, whose removal failed (:func:`_forget_earlier_error`)."""
    if job.get_status(refresh=False) == JobStatus.FINISHED:
        return None
    sealed = job.meta.get(SEALED_ERROR)
    return None if sealed is None else open_error(job.id, sealed)

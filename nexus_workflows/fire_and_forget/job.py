"""The job body an RQ worker runs: look the workflow up and call ``prepare(trigger)`` once."""

from __future__ import annotations

import logging
import traceback
from typing import Any

from rq import get_current_job

from nexus_workflows.deferred.history import describe_error
from nexus_workflows.deferred.registry import registry
from nexus_workflows.exceptions import (
    JobFailed,
    UnknownWorkflow,
    WorkflowError,
)

logger = logging.getLogger("nexus_workflows.fire_and_forget")


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

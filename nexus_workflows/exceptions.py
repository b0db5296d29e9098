"""Exceptions a caller of nexus_workflows can act on.

Registration and enqueue errors share one base class, :class:`WorkflowError`, so a caller
can catch every misuse of the API at once. :class:`PermanentError` and :class:`ClaimLost`
are not misuse: the first is raised *by* a workflow to give up, the second tells a
workflow that its attempt no longer owns the work.
"""

from __future__ import annotations


class WorkflowError(Exception):
    """Base class of every registration and enqueue error, and of the app's other errors
    a caller can act on (bad purge options, a dedupe key that would not settle)."""


class RegistrationError(WorkflowError, ValueError):
    """A workflow definition breaks one of the registration rules."""


class AlreadyRegistered(RegistrationError):
    """A kind was registered twice."""


class UnknownWorkflow(WorkflowError, LookupError):
    """No workflow is registered under the kind that was asked for."""


class UnknownQueue(WorkflowError, LookupError):
    """A runner was asked for a Django task queue that no Tasks backend of this app allows."""


class EnqueueError(WorkflowError, ValueError):
    """An enqueue call was rejected before anything was written."""


class DedupeKeyUnsettled(WorkflowError, RuntimeError):
    """An enqueue gave up on a dedupe key whose row kept changing under concurrent writers
    (inserted, purged, revived by others) for every one of its rounds; no work was enqueued
    or revived by the call (a bulk call's whole batch is rolled back). Transient: enqueueing
    again later settles it. A ``RuntimeError`` too, as it was before it had a class of its
    own. Its message names the kind and a count, never a key."""


class InvalidDedupeKey(EnqueueError):
    """The workflow's ``dedupe_key`` function returned an unusable key."""


class InvalidTrigger(EnqueueError):
    """The trigger cannot be stored as JSON."""


class InvalidEnqueueOption(EnqueueError, TypeError):
    """An option passed to ``enqueue`` is unknown or has a bad value."""


class EnqueueRejected(EnqueueError):
    """The database refused new work for a reason other than the dedupe key (a constraint
    or trigger added outside the app); nothing was written."""


class InvalidFlowKey(EnqueueError):
    """A workflow's ``serial_key`` or ``rate_key`` function failed or returned something
    other than a string or ``None``."""


class InvalidRateLimit(WorkflowError, ValueError):
    """``rate_limited`` was called with a bad name, limit, period or timeout."""


class RateLimitTimeout(TimeoutError):
    """``rate_limited`` waited ``timeout`` seconds without getting a slot of its window.

    Transient (not ``permanent``): a deferred workflow that lets it escape walks its
    retry schedule.
    """

    permanent = False


class InvalidPurgeOption(WorkflowError, ValueError):
    """A purge (``retention.purge_batch``, ``prune_rate_windows``) was given a batch size or
    a lock wait it cannot use; nothing was deleted."""


class QueueUnavailable(WorkflowError):
    """The Redis server behind the fire-and-forget queue cannot be reached."""


class SealedDataUnreadable(WorkflowError):
    """A fire-and-forget job's sealed trigger or error message opens with no configured
    PHI encryption key (a key was removed too early, or the value was altered).

    Its message does not name the job: a job id holds the dedupe key, which may be derived
    from patient data, and the message reaches RQ's failure records and the worker's log.
    The id is :attr:`job_id`, for a caller that shows it where job ids are shown anyway."""

    def __init__(self, message: str, *, job_id: str | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class JobFailed(Exception):
    """A fire-and-forget job's ``prepare`` raised; this is what RQ records and logs.

    Its message names the workflow, the original exception's type and where it was
    raised, but not the original message, which may carry patient data and would reach
    the worker's log. That message is sealed into the job's ``meta["sealed_error"]``, and
    shown on the admin's reveal page for the job (behind ``reveal_deferredwork``, audited).
    """


class InvalidCheckpoint(WorkflowError, ValueError):
    """``save(patch)`` was given something that cannot be stored in the journal."""


class PermanentError(Exception):
    """Raise from ``prepare`` to abandon the work at once instead of retrying.

    Any exception whose ``permanent`` attribute is ``True`` is treated the same way,
    which is how the Airtable helpers tag their non-retryable 4xx errors.
    """

    permanent = True


class ClaimLost(Exception):
    """The attempt no longer holds its claim on the work; nothing was written.

    Raised by ``save(patch)`` when another runner has reclaimed the work (because this
    one stopped heart-beating) or an operator changed it. The attempt must stop: its
    results will be discarded.
    """


class WorkerLost(Exception):
    """Recorded (never raised) when work is abandoned because its runners kept dying: the
    error class of a Django task that was lost more often than its retries allow."""


class OutcomeNotStored(Exception):
    """Recorded (never raised) in place of a succeeded attempt whose outcome the database
    kept refusing for a reason other than an outage (a project's trigger or constraint, a
    value it will not store). Permanent: the work is abandoned, as the attempt's effects
    happened and running it again may repeat them; an operator decides."""

    permanent = True


def is_permanent(error: BaseException) -> bool:
    """Whether a failure should abandon the work instead of walking the schedule."""
    return getattr(error, "permanent", False) is True

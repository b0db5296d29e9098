"""nexus_workflows: durable, deduplicated workflows for Django.

Public API::

    from nexus_workflows import register, workflow, enqueue, enqueue_many
    from nexus_workflows import PermanentError, ClaimLost, WorkflowError
    from nexus_workflows import rate_limited, RateLimitTimeout
"""

from nexus_workflows.deferred.enqueue import enqueue, enqueue_many
from nexus_workflows.deferred.registry import Workflow, register, workflow
from nexus_workflows.exceptions import (
    AlreadyRegistered,
    ClaimLost,
    DedupeKeyUnsettled,
    EnqueueError,
    EnqueueRejected,
    InvalidCheckpoint,
    InvalidDedupeKey,
    InvalidEnqueueOption,
    InvalidFlowKey,
    InvalidPurgeOption,
    InvalidRateLimit,
    InvalidTrigger,
    JobFailed,
    PermanentError,
    QueueUnavailable,
    RateLimitTimeout,
    RegistrationError,
    SealedDataUnreadable,
    UnknownWorkflow,
    WorkflowError,
)
from nexus_workflows.flow import rate_limited

__version__ = "0.1.0"

__all__ = [
    "AlreadyRegistered",
    "ClaimLost",
    "DedupeKeyUnsettled",
    "EnqueueError",
    "EnqueueRejected",
    "InvalidCheckpoint",
    "InvalidDedupeKey",
    "InvalidEnqueueOption",
    "InvalidFlowKey",
    "InvalidPurgeOption",
    "InvalidRateLimit",
    "InvalidTrigger",
    "JobFailed",
    "PermanentError",
    "QueueUnavailable",
    "RateLimitTimeout",
    "RegistrationError",
    "SealedDataUnreadable",
    "UnknownWorkflow",
    "Workflow",
    "WorkflowError",
    "enqueue",
    "enqueue_many",
    "rate_limited",
    "register",
    "workflow",
]

"""nexus_workflows: durable, deduplicated workflows for Django.

Public API::

    from nexus_workflows import register, workflow, enqueue, enqueue_many
    from nexus_workflows import PermanentError, ClaimLost, WorkflowError
    from nexus_workflows import rate_limited, RateLimitTimeout
"""

from .enqueueing import enqueue, enqueue_many
from .exceptions import (
    AlreadyRegistered,
    ClaimLost,
    EnqueueError,
    EnqueueRejected,
    InvalidCheckpoint,
    InvalidDedupeKey,
    InvalidEnqueueOption,
    InvalidFlowKey,
    InvalidRateLimit,
    InvalidTrigger,
    JobFailed,
    PermanentError,
    QueueUnavailable,
    RateLimitTimeout,
    RegistrationError,
    UnknownWorkflow,
    WorkflowError,
)
from .flow import rate_limited
from .registry import Workflow, register, workflow

__version__ = "0.1.0"

__all__ = [
    "AlreadyRegistered",
    "ClaimLost",
    "EnqueueError",
    "EnqueueRejected",
    "InvalidCheckpoint",
    "InvalidDedupeKey",
    "InvalidEnqueueOption",
    "InvalidFlowKey",
    "InvalidRateLimit",
    "InvalidTrigger",
    "JobFailed",
    "PermanentError",
    "QueueUnavailable",
    "RateLimitTimeout",
    "RegistrationError",
    "UnknownWorkflow",
    "Workflow",
    "WorkflowError",
    "enqueue",
    "enqueue_many",
    "rate_limited",
    "register",
    "workflow",
]

"""nexus_workflows: durable, deduplicated workflows for Django.

Public API::

    from nexus_workflows import register, workflow, enqueue, enqueue_many
    from nexus_workflows import PermanentError, ClaimLost, WorkflowError
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
    InvalidTrigger,
    JobFailed,
    PermanentError,
    QueueUnavailable,
    RegistrationError,
    UnknownWorkflow,
    WorkflowError,
)
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
    "InvalidTrigger",
    "JobFailed",
    "PermanentError",
    "QueueUnavailable",
    "RegistrationError",
    "UnknownWorkflow",
    "Workflow",
    "WorkflowError",
    "enqueue",
    "enqueue_many",
    "register",
    "workflow",
]

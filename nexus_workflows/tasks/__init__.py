"""Django's Tasks API on the durable runner.

``TASKS = {"default": {"BACKEND": "nexus_workflows.tasks.DeferredBackend"}}`` makes every
``@task`` function a row of :class:`~nexus_workflows.models.DeferredWork` (kind = the task's
import path) that ``manage.py runworkflows`` runs with the claims, fences, heartbeats,
reclaims, retries and retention of deferred workflows. It works on ``django.tasks``
(Django 6.0+) and on the ``django-tasks`` backport (Django 5.2).
"""

from nexus_workflows.tasks.backend import (
    DeferredBackend,
    DeferredTask,
    InvalidTaskArguments,
    InvalidTaskOptions,
)

__all__ = ["DeferredBackend", "DeferredTask", "InvalidTaskArguments", "InvalidTaskOptions"]

"""Rows in every state and users with and without the revive and reveal permissions."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from nexus_workflows.deferred.history import append_entry
from nexus_workflows.deferred.registry import Workflow
from nexus_workflows.models import DeferredWork, Status

PASSWORD = "correct horse battery staple"

_keys = itertools.count(1)


def _noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    return None


@pytest.fixture
def workflow(register_workflow: Callable[..., Workflow]) -> Workflow:
    """A registered deferred kind allowing three attempts."""
    return register_workflow(_noop, retry_schedule=[1, 5])


@pytest.fixture
def make_work(workflow: Workflow) -> Callable[..., DeferredWork]:
    def make(status: str = Status.PENDING, **fields: Any) -> DeferredWork:
        now = timezone.now()
        values: dict[str, Any] = {
            "kind": workflow.kind,
            "dedupe_key": f"visit-{next(_keys)}",
            "trigger": {"visit": 1},
            "status": status,
            "created_at": now,
            "updated_at": now,
        }
        if status == Status.ABANDONED:
            values.update(
                attempt=2,
                last_error="UpstreamError: HTTP 503 from the scheduler\nretry budget exhausted",
                checkpoints={"fetched": True},
                history=append_entry(
                    append_entry([], attempt=1, outcome="rescheduled", error="UpstreamError: timeout"),
                    attempt=2,
                    outcome="abandoned",
                    reason="retry schedule exhausted",
                    error="UpstreamError: HTTP 503 from the scheduler",
                ),
            )
        if status == Status.PROCESSING:
            values.update(claim_token="a" * 32, claimed_at=now, heartbeat_at=now)
        values.update(fields)
        return DeferredWork.objects.create(**values)

    return make


@pytest.fixture
def stale_heartbeat() -> Any:
    """A heartbeat time well past the default STALE_AFTER."""
    return timezone.now() - timedelta(hours=1)


def _user(username: str, *codenames: str, superuser: bool = False) -> User:
    if superuser:
        return User.objects.create_superuser(username, f"{username}@example.org", PASSWORD)
    user = User.objects.create_user(username, password=PASSWORD, is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="nexus_workflows", codename__in=codenames)
    )
    return user


@pytest.fixture
def superuser(db: None) -> User:
    return _user("root", superuser=True)


@pytest.fixture
def triager(db: None) -> User:
    """Staff who may view and revive, and nothing else."""
    return _user("triager", "view_deferredwork", "revive_deferredwork")


@pytest.fixture
def changer(db: None) -> User:
    """Staff with view, change and delete but without the revive permission."""
    return _user("changer", "view_deferredwork", "change_deferredwork", "delete_deferredwork")


@pytest.fixture
def viewer(db: None) -> User:
    return _user("viewer", "view_deferredwork")


@pytest.fixture
def revealer(db: None) -> User:
    """Staff who may view deferred work and reveal its patient data, and nothing else."""
    return _user("revealer", "view_deferredwork", "reveal_deferredwork")


def client_for(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client

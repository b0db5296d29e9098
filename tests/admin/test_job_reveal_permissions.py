"""A fire-and-forget job's reveal page asks for what a work item's reveal asks for: the
reveal permission and the view (or change) permission on deferred work. The reveal
permission alone opened it before (real users, real Redis, the Django test client)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from nexus_workflows import enqueue
from nexus_workflows.admin.jobs import audit_id
from tests.admin.conftest import _user, client_for

pytestmark = pytest.mark.django_db(transaction=True)

PHONE = "+525511223344"


@pytest.fixture
def failed_job(rq_redis: Any, rq_burst: Callable[..., int]) -> str:
    job_id = enqueue("test-ff-fail", {"key": "perm1", "secret": PHONE})
    assert rq_burst() == 1
    return job_id


def reveal_url(job_id: str) -> str:
    return reverse("admin:nexus_workflows_deferredwork_job_reveal", args=["default", job_id])


def test_the_reveal_permission_alone_gets_403_and_nothing_is_logged(failed_job: str) -> None:
    client = client_for(_user("reveal-only", "reveal_deferredwork"))
    for response in (client.get(reveal_url(failed_job)), client.post(reveal_url(failed_job))):
        assert response.status_code == 403
        assert PHONE not in response.content.decode()
    assert not LogEntry.objects.exists()


@pytest.mark.parametrize("view", ["view_deferredwork", "change_deferredwork"])
def test_reveal_with_view_or_change_reveals_and_is_audited(failed_job: str, view: str) -> None:
    user = _user(f"reveal-{view}", "reveal_deferredwork", view)
    response = client_for(user).post(reveal_url(failed_job))
    assert response.status_code == 200
    assert PHONE in response.content.decode()
    entry = LogEntry.objects.get()
    assert (entry.user, entry.object_id) == (user, audit_id("test-ff-fail", failed_job))


def test_view_without_reveal_gets_403(failed_job: str) -> None:
    response = client_for(_user("view-only", "view_deferredwork")).post(reveal_url(failed_job))
    assert response.status_code == 403
    assert not LogEntry.objects.exists()

"""The reveal pages and the find box refuse a POST without the user's CSRF token (a
cross-site form, a replayed request): nothing is shown, found or recorded."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from nexus_workflows.models import Status
from tests.admin.conftest import PASSWORD

pytestmark = pytest.mark.django_db

SECRET = "Zorbatilde Quixhuatl"


def test_a_post_without_the_csrf_token_reveals_and_finds_nothing(revealer, make_work):
    work = make_work(Status.ABANDONED, dedupe_key="visit-31", trigger={"patient": SECRET})
    client = Client(enforce_csrf_checks=True)
    assert client.login(username=revealer.username, password=PASSWORD)
    reveal = reverse("admin:nexus_workflows_deferredwork_reveal", args=[work.pk])
    find = reverse("admin:nexus_workflows_deferredwork_find")

    for url, data in ((reveal, {}), (find, {"key": "visit-31"})):
        response = client.post(url, data)
        assert response.status_code == 403, url
        assert SECRET not in response.content.decode()
    assert not LogEntry.objects.exists()

    # With the token the page's own form carries, the same POST reveals.
    client.get(reveal)
    token = client.cookies["csrftoken"].value
    revealed = client.post(reveal, {"csrfmiddlewaretoken": token})
    assert revealed.status_code == 200
    assert SECRET in revealed.content.decode()
    assert LogEntry.objects.count() == 1

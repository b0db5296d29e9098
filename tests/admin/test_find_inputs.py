"""What the find box is typed that no stored key can be: it finds nothing, as any other
miss, rather than failing (PostgreSQL refuses a NUL character in a query's text)."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from nexus_workflows.models import Status
from tests.admin.conftest import client_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_key_with_a_nul_character_finds_nothing(viewer, make_work):
    make_work(Status.DONE, dedupe_key="visit-5")
    client = client_for(viewer)
    for typed in ("visit-5\x00", "\x00"):
        response = client.post(reverse("admin:nexus_workflows_deferredwork_find"), {"key": typed})
        assert (response.status_code, response["Location"]) == (
            302,
            reverse("admin:nexus_workflows_deferredwork_changelist"),
        )
        said = [str(message) for message in get_messages(response.wsgi_request)]
        assert said[-1] == "No deferred work has that dedupe key."


def test_a_code_with_a_nul_character_finds_no_map(superuser):
    response = client_for(superuser).post(
        reverse("admin:nexus_workflows_tokenmap_find"), {"code": "conv\x00-1"}
    )
    assert (response.status_code, response["Location"]) == (
        302,
        reverse("admin:nexus_workflows_tokenmap_changelist"),
    )

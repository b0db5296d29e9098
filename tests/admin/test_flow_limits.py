"""The admin's flow-control filter and the card line saying which limit holds an item."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from nexus_workflows import enqueue_many
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.models import DeferredWork, Status
from tests.admin.conftest import client_for

pytestmark = pytest.mark.django_db


def _noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    return None


def test_filter_lists_items_held_by_a_limit_and_the_card_names_the_limit(
    superuser: Any, register_workflow: Any
) -> None:
    kind = register_workflow(_noop, retry_schedule=[1], serial_key=lambda t: t["to"]).kind
    enqueue_many(kind, [{"key": "first", "to": "+5215555550000"}, {"key": "second", "to": "+5215555550000"}])
    enqueue_many(kind, [{"key": "alone", "to": "other"}])
    Claimer(kinds=[kind], using="default").claim_due(1)  # "first" runs; "second" waits on its key
    client = client_for(superuser)
    listing = client.get(reverse("admin:nexus_workflows_deferredwork_changelist"), {"flow": "waiting"})
    assert listing.status_code == 200
    text = listing.content.decode()
    assert "Waiting on a limit" in text
    assert "second" in text
    assert "alone" not in text  # due and free to start: not held
    assert "5555" not in text  # the key itself never shows
    second = DeferredWork.objects.get(dedupe_key="second")
    assert second.status == Status.PENDING
    card = client.get(reverse("admin:nexus_workflows_deferredwork_change", args=[second.pk])).content.decode()
    assert "Held back by a flow limit" in card
    assert "its serial key: another item of the same key is running" in card

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


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True, databases=["default", "direct"])
@pytest.mark.parametrize("router", ["WorkReadFromDirect", "WorkReadFromEitherReplica"])
def test_the_filter_where_a_router_sends_reads_to_replicas(
    superuser: Any, register_workflow: Any, settings: Any, router: str
) -> None:
    """The filter's subqueries are bound to the replica's alias (``queryset.db``), which
    Django refuses to compile for another ("Subqueries aren't allowed across different
    databases": a server error): the list's estimate compiled its statement for "default",
    and under Django's documented router (a replica of its choice per read) the list was
    read on another replica than the one they were bound to."""
    settings.DATABASE_ROUTERS = [f"tests.testapp.routers.{router}"]
    kind = register_workflow(_noop, retry_schedule=[1], serial_key=lambda t: t["to"]).kind
    enqueue_many(kind, [{"key": "first", "to": "+5215555550000"}, {"key": "second", "to": "+5215555550000"}])
    enqueue_many(kind, [{"key": "alone", "to": "other"}])
    Claimer(kinds=[kind], using="default").claim_due(1)
    client = client_for(superuser)
    for _ in range(2):  # the router's turn differs by one read between two pages
        listing = client.get(reverse("admin:nexus_workflows_deferredwork_changelist"), {"flow": "waiting"})
        assert listing.status_code == 200
        cl = listing.context["cl"]
        assert [work.dedupe_key for work in cl.result_list] == ["second"]
        assert cl.result_count == 1

"""Every admin page of the app is read-only through one mixin, and its words go through
Django's translation machinery (plurals through ``ngettext``)."""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.utils.functional import Promise
from django.utils.translation import override

from nexus_workflows.admin import MADE_DUE, REVIVED, DeferredWorkAdmin, describe_result
from nexus_workflows.admin.readonly import ReadOnlyAdminMixin
from nexus_workflows.deferred import triage
from nexus_workflows.models import DeferredWork, PhiToken, Runner, TokenMap

pytestmark = pytest.mark.django_db

#: Whether each read-only admin lets a superuser delete rows by hand.
DELETABLE = {DeferredWork: True, Runner: False, TokenMap: False, PhiToken: False}


@pytest.mark.parametrize("model", list(DELETABLE), ids=lambda m: m.__name__)
def test_the_apps_admins_never_add_or_change_and_delete_only_where_allowed(model: type) -> None:
    model_admin = admin.site._registry[model]
    request = RequestFactory().get("/")
    request.user = User.objects.create_superuser("root", "root@example.com", "x")
    assert isinstance(model_admin, ReadOnlyAdminMixin)
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert model_admin.has_delete_permission(request) is DELETABLE[model]
    inlines = model_admin.get_inline_instances(request)
    assert all(isinstance(inline, ReadOnlyAdminMixin) for inline in inlines)
    assert all(not inline.has_add_permission(request, None) for inline in inlines)


def test_admin_words_are_translatable() -> None:
    actions = [DeferredWorkAdmin.revive_selected, DeferredWorkAdmin.run_selected_now]
    assert all(isinstance(action.short_description, Promise) for action in actions)
    names = [name for name in DeferredWorkAdmin.list_display if hasattr(DeferredWorkAdmin, name)]
    columns = [getattr(DeferredWorkAdmin, name) for name in names]
    assert len(columns) >= 5
    assert all(isinstance(column.short_description, Promise) for column in columns)
    assert isinstance(DeferredWorkAdmin.search_help_text, Promise)


def _result(changed: int, skipped: list[str]) -> triage.TriageResult:
    ref = triage.WorkRef
    return triage.TriageResult(
        changed=[ref(pk=n, kind="k", dedupe_key=str(n), status="pending") for n in range(changed)],
        skipped=[ref(pk=99 + n, kind="k", dedupe_key="s", status=status) for n, status in enumerate(skipped)],
    )


@pytest.mark.parametrize(
    ("changed", "skipped", "wording", "message"),
    [
        (1, [], REVIVED, "Revived 1 item; skipped none."),
        (2, ["pending"], REVIVED, "Revived 2 items; skipped 1 that was not abandoned (1 pending)."),
        (
            0,
            ["processing", "done"],
            MADE_DUE,
            "Made due now 0 items; skipped 2 that were not pending (1 done, 1 processing).",
        ),
    ],
)
def test_result_messages_have_plurals(changed: int, skipped: list[str], wording, message: str) -> None:
    with override("en"):
        assert describe_result(_result(changed, skipped), wording) == message


@pytest.mark.parametrize("page", ["reveal", "revive", "run_now"])
def test_a_missing_object_leads_to_the_index_with_a_warning(superuser: User, page: str) -> None:
    from django.urls import reverse

    from tests.admin.conftest import client_for

    url = reverse(f"admin:nexus_workflows_deferredwork_{page}", args=[987654])
    client = client_for(superuser)
    response = client.post(url, follow=True)
    assert response.redirect_chain == [(reverse("admin:index"), 302)]
    texts = [str(message) for message in response.context["messages"]]
    assert texts == ["deferred work with ID “987654” doesn’t exist. Perhaps it was deleted?"]  # noqa: RUF001

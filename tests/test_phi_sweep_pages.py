"""A canary sweep of every page of one item a staff user can open without the reveal
permission's POST, and of what the browser and the session keep: patient data in a work's
dedupe key, trigger, checkpoints, last error and history reaches none of them.

Pages: the item's change page, its history (the admin log of reveals, finds, revives),
its delete confirmation, the bulk delete's confirmation, the reveal page's GET
confirmation, the list after a revive (its flash message) and the admin's index ("recent
actions"). Kept: response headers and cookies (Django's messages go into a cookie first),
and the session rows."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin import helpers
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.test import Client

from nexus_workflows.deferred.history import append_entry
from nexus_workflows.models import DeferredWork, Status

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "Zorbatilde Quixhuatl"
PHONE = "+52 55 8731 4926"
MARKS = ("zorbatilde", "quixhuatl", "8731 4926", "87314926")


def leaks(text: str) -> list[str]:
    lowered = text.lower()
    return [mark for mark in MARKS if mark in lowered]


def seen_in(response: Any) -> str:
    headers = " ".join(f"{name}: {value}" for name, value in response.items())
    cookies = " ".join(f"{morsel.key}={morsel.value}" for morsel in response.cookies.values())
    return f"{headers} {cookies} {response.content.decode(errors='replace')}"


def test_no_page_of_an_item_nor_what_the_browser_keeps_shows_its_patient_data(register_workflow) -> None:
    kind = register_workflow(lambda t, c, s: None, dedupe_key=lambda t: t["name"], retry_schedule=[1]).kind
    error = f"ValueError: no visit for {NAME} ({PHONE})"
    work = DeferredWork.objects.create(
        kind=kind,
        dedupe_key=NAME,
        trigger={"name": NAME, "phone": PHONE},
        checkpoints={"called": PHONE},
        status=Status.ABANDONED,
        attempt=1,
        last_error=error,
        history=append_entry([], attempt=1, outcome="abandoned", reason=f"told {NAME}", error=error),
    )
    User.objects.create_superuser("root", "root@example.org", "pw-pw-pw-pw")
    client = Client()
    assert client.login(username="root", password="pw-pw-pw-pw")
    base = "/admin/nexus_workflows/deferredwork/"
    seen: list[tuple[str, str]] = []

    def visit(what: str, response: Any) -> None:
        assert response.status_code in (200, 302), (what, response.status_code)
        seen.append((what, seen_in(response)))

    visit("find", client.post(f"{base}find/", {"key": NAME}))  # audited: a log entry
    visit("reveal (GET)", client.get(f"{base}{work.pk}/reveal/"))
    revealed = client.post(f"{base}{work.pk}/reveal/")  # audited; the page itself shows it
    assert NAME in revealed.content.decode()
    seen.append(("reveal (headers)", " ".join(f"{k}: {v}" for k, v in revealed.items())))
    for what, url in (
        ("change", f"{base}{work.pk}/change/"),
        ("history", f"{base}{work.pk}/history/"),
        ("delete", f"{base}{work.pk}/delete/"),
        ("index", "/admin/"),
    ):
        visit(what, client.get(url))
    action = {"action": "delete_selected", helpers.ACTION_CHECKBOX_NAME: [str(work.pk)]}
    visit("bulk delete confirmation", client.post(base, action))
    revive = {"action": "revive_selected", helpers.ACTION_CHECKBOX_NAME: [str(work.pk)]}
    visit("revive", client.post(base, revive))
    visit("list after the revive", client.get(base))
    seen.extend(("session", session.get_decoded().__repr__()) for session in Session.objects.all())

    assert [(where, leaks(text)) for where, text in seen if leaks(text)] == []

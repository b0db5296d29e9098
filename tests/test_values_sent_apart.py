"""Every statement the app sends with patient data in it (a trigger, a dedupe key) goes to
PostgreSQL with its values apart from its text (``sql.postgresql.values_sent_apart``), so
that a failed or cancelled one is logged without them: enqueue's INSERT and its reads of a
taken key, ``enqueue_many``'s, a Django task's enqueue, the admin's find box and
``workflows revive --key``. Each statement is seen as it is executed, with the cursor
class that binds it. The runner's writes are checked on a private server's own log
(``tests/faults/test_server_log.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.urls import reverse

from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.models import DeferredWork, Status

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

PHONE = "+52 55 4417 9023"


@pytest.fixture
def sent() -> Iterator[list[tuple[str, str]]]:
    """(cursor class, statement's first word) of every statement carrying ``PHONE``."""
    seen: list[tuple[str, str]] = []

    def record(execute: Callable[..., Any], statement: str, params: Any, many: bool, context: Any) -> Any:
        if PHONE in repr(params):
            seen.append((type(context["cursor"].cursor).__name__, statement.split()[0].upper()))
        return execute(statement, params, many, context)

    with connection.execute_wrapper(record):
        yield seen


def test_enqueue_sends_the_trigger_and_its_reads_of_a_taken_key_apart(sent: list[tuple[str, str]]) -> None:
    trigger = {"key": PHONE}
    first = enqueue("test-noop", trigger)
    assert enqueue("test-noop", trigger) == first  # pending: read back by its key
    DeferredWork.objects.filter(pk=first).update(status=Status.ABANDONED)
    assert enqueue("test-noop", trigger) == first  # revived (its UPDATE carries no key)
    assert {word for _, word in sent} == {"INSERT", "SELECT"}
    assert {cursor for cursor, _ in sent} == {"ServerBindingCursor"}


def test_enqueue_many_sends_the_triggers_and_its_reads_of_taken_keys_apart(
    sent: list[tuple[str, str]],
) -> None:
    triggers = [{"key": PHONE}, {"key": f"{PHONE}-2"}]
    first = enqueue_many("test-noop", triggers)
    assert enqueue_many("test-noop", triggers) == first
    assert {"INSERT", "SELECT"} <= {word for _, word in sent}
    assert {cursor for cursor, _ in sent} == {"ServerBindingCursor"}


def test_the_admin_find_box_sends_the_key_apart(sent: list[tuple[str, str]]) -> None:
    work = enqueue("test-noop", {"key": PHONE})
    user = User.objects.create_user("viewer", password="x", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_deferredwork"))
    client = Client()
    client.force_login(user)
    sent.clear()
    found = client.post(reverse("admin:nexus_workflows_deferredwork_find"), {"key": PHONE})
    assert found.status_code == 302
    assert f"/{work}/" in found["Location"]
    assert [word for _, word in sent] == ["SELECT"]
    assert {cursor for cursor, _ in sent} == {"ServerBindingCursor"}


def test_workflows_revive_by_key_sends_the_key_apart(sent: list[tuple[str, str]]) -> None:
    work = enqueue("test-noop", {"key": PHONE})
    DeferredWork.objects.filter(pk=work).update(status=Status.ABANDONED)
    sent.clear()
    call_command("workflows", "revive", "--kind", "test-noop", "--key", PHONE)
    assert DeferredWork.objects.get(pk=work).status == Status.PENDING
    assert "SELECT" in {word for _, word in sent}
    assert {cursor for cursor, _ in sent} == {"ServerBindingCursor"}


def test_a_django_tasks_arguments_are_sent_apart(sent: list[tuple[str, str]]) -> None:
    from tests.testapp import tasks

    tasks.record.enqueue(PHONE)
    assert [word for _, word in sent] == ["INSERT"]
    assert {cursor for cursor, _ in sent} == {"ServerBindingCursor"}

"""A row selected on the list page but deleted before the action's POST (purged, deleted by
a colleague) is counted as skipped and gone, not silently left out of the message; so is a
row deleted between the action's read of the ids and its read of the rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from nexus_workflows.models import DeferredWork, Status
from tests.admin.conftest import client_for
from tests.admin.test_admin import action, message_texts


def test_revive_action_counts_a_selected_row_deleted_before_the_post(triager, make_work):
    kept, deleted = make_work(Status.ABANDONED), make_work(Status.ABANDONED)
    DeferredWork.objects.filter(pk=deleted.pk).delete()  # after the page, before the POST

    response = action(client_for(triager), "revive_selected", [kept, deleted])

    assert message_texts(response) == [
        ("warning", "Revived 1 item; skipped 1 that was not abandoned (1 gone).")
    ]


def test_run_now_action_counts_selected_rows_deleted_before_the_post(triager, make_work):
    later = timezone.now() + timedelta(hours=1)
    works = [make_work(Status.PENDING, next_attempt_at=later) for _ in range(3)]
    DeferredWork.objects.filter(pk__in=[works[0].pk, works[2].pk]).delete()

    response = action(client_for(triager), "run_selected_now", works)

    assert message_texts(response) == [
        ("warning", "Made due now 1 item; skipped 2 that were not pending (2 gone).")
    ]


def test_select_across_counts_no_gone_rows(triager, make_work):
    works = [make_work(Status.ABANDONED) for _ in range(2)]
    client = client_for(triager)

    response = client.post(
        reverse("admin:nexus_workflows_deferredwork_changelist"),
        {"action": "revive_selected", "_selected_action": [works[0].pk], "select_across": "1", "index": 0},
        follow=True,
    )

    assert message_texts(response) == [("success", "Revived 2 items; skipped none.")]


def delete_before_the_rows_are_read(pk: int) -> Any:
    """An execute wrapper: row ``pk`` is deleted (a purge, a colleague) after the action read
    the ids it will act on and before it reads those rows whole (the first read of
    ``history``, which only that read selects)."""
    done: list[bool] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not done and sql.lstrip().upper().startswith("SELECT") and "history" in sql:
            done.append(True)
            DeferredWork.objects.filter(pk=pk).delete()
        return execute(sql, params, many, context)

    return wrapper


@pytest.mark.parametrize(
    ("name", "status", "message"),
    [
        ("revive_selected", Status.ABANDONED, "Revived 1 item; skipped 1 that was not abandoned (1 gone)."),
        ("run_selected_now", Status.PENDING, "Made due now 1 item; skipped 1 that was not pending (1 gone)."),
    ],
)
def test_select_across_counts_a_row_deleted_between_the_actions_reads(
    triager, make_work, name: str, status: str, message: str
):
    """ "Select all" is a filter, not posted ids (account_for_selected does not apply): the
    action itself accounts for the row it read the id of and then found gone."""
    later = timezone.now() + timedelta(hours=1)
    kept, deleted = (make_work(status, next_attempt_at=later) for _ in range(2))
    client = client_for(triager)
    posted = {"action": name, "_selected_action": [kept.pk], "select_across": "1", "index": 0}

    with connection.execute_wrapper(delete_before_the_rows_are_read(deleted.pk)):
        response = client.post(reverse("admin:nexus_workflows_deferredwork_changelist"), posted, follow=True)

    assert message_texts(response) == [("warning", message)]
    assert not DeferredWork.objects.filter(pk=deleted.pk).exists()  # the premise: it was deleted

"""A row selected on the list page but deleted before the action's POST (purged, deleted by
a colleague) is counted as skipped and gone, not silently left out of the message."""

from __future__ import annotations

from datetime import timedelta

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

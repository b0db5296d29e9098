"""A row ticked on a filtered list that left the filter before the action's POST (a runner
or a colleague changed its status) is reported as skipped and "changed"; "gone" stays for
rows deleted or purged since (before, both read "gone")."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from nexus_workflows.models import DeferredWork, Status
from tests.admin.conftest import client_for
from tests.admin.test_admin import action, message_texts


def test_revive_on_a_filtered_list_tells_changed_rows_from_gone_ones(triager, make_work):
    kept, changed, deleted = (make_work(Status.ABANDONED) for _ in range(3))
    # After the list ?status=abandoned was drawn, before the POST:
    DeferredWork.objects.filter(pk=changed.pk).update(status=Status.PENDING)  # revived elsewhere
    DeferredWork.objects.filter(pk=deleted.pk).delete()

    response = action(client_for(triager), "revive_selected", [kept, changed, deleted], "?status=abandoned")

    assert message_texts(response) == [
        ("warning", "Revived 1 item; skipped 2 that were not abandoned (1 changed, 1 gone).")
    ]
    assert DeferredWork.objects.get(pk=kept.pk).status == Status.PENDING


def test_run_now_on_a_filtered_list_counts_a_row_a_runner_claimed_as_changed(triager, make_work):
    later = timezone.now() + timedelta(hours=1)
    waiting, claimed = (make_work(Status.PENDING, next_attempt_at=later) for _ in range(2))
    DeferredWork.objects.filter(pk=claimed.pk).update(status=Status.PROCESSING)

    response = action(client_for(triager), "run_selected_now", [waiting, claimed], "?status=pending")

    assert message_texts(response) == [
        ("warning", "Made due now 1 item; skipped 1 that was not pending (1 changed).")
    ]
    assert DeferredWork.objects.get(pk=claimed.pk).status == Status.PROCESSING  # never touched

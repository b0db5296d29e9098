"""nexus_workflows.deferred.triage: revive and run-now are compare-and-set and leave a trace."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from nexus_workflows.deferred import enqueue as enqueueing
from nexus_workflows.deferred import triage
from nexus_workflows.deferred.enqueue import enqueue
from nexus_workflows.models import DeferredWork, Status
from tests.admin.test_actions_gone_rows import delete_before_the_rows_are_read
from tests.clock import database_resolution_now

pytestmark = pytest.mark.django_db


def test_revive_resets_abandoned_work_and_keeps_its_checkpoints(make_work):
    work = make_work(Status.ABANDONED, next_attempt_at=timezone.now() + timedelta(days=1))
    before = database_resolution_now()

    result = triage.revive(DeferredWork.objects.filter(pk=work.pk), by="admin", user="alice")

    assert [ref.pk for ref in result.changed] == [work.pk]
    assert result.skipped == []
    work.refresh_from_db()
    assert work.status == Status.PENDING
    assert work.attempt == 0
    assert before <= work.next_attempt_at <= timezone.now()
    assert work.last_error == ""
    assert work.checkpoints == {"fetched": True}
    assert work.updated_at >= before
    # the old entries stay, the revive is appended with who did it
    assert [entry.get("outcome") or entry.get("event") for entry in work.history] == [
        "rescheduled",
        "abandoned",
        "revived",
    ]
    assert work.history[-1]["by"] == "admin"
    assert work.history[-1]["user"] == "alice"


def test_revive_skips_everything_that_is_not_abandoned(make_work, stale_heartbeat):
    pending = make_work(Status.PENDING)
    running = make_work(Status.PROCESSING)
    stale = make_work(Status.PROCESSING, heartbeat_at=stale_heartbeat)
    done = make_work(Status.DONE)
    abandoned = make_work(Status.ABANDONED)
    snapshot = {
        w.pk: DeferredWork.objects.filter(pk=w.pk).values().get() for w in (pending, running, stale, done)
    }

    result = triage.revive(DeferredWork.objects.all(), by="command line")

    assert [ref.pk for ref in result.changed] == [abandoned.pk]
    assert sorted((ref.pk, ref.status) for ref in result.skipped) == sorted(
        [
            (pending.pk, "pending"),
            (running.pk, "processing"),
            (stale.pk, "processing"),
            (done.pk, "done"),
        ]
    )
    for pk, row in snapshot.items():
        assert DeferredWork.objects.filter(pk=pk).values().get() == row  # untouched, byte for byte


def test_revive_reads_again_when_the_row_changed_after_it_was_read(make_work, monkeypatch):
    """The write is conditional on updated_at: a row that changed between the read and
    the write is read again, so its newer history is not overwritten."""
    work = make_work(Status.ABANDONED)
    real_rows = triage._rows

    def rows_then_change(queryset):
        for row in real_rows(queryset):
            # Another writer (an enqueue revive, then a runner abandoning it again)
            # changes the row after we read it.
            DeferredWork.objects.filter(pk=row["pk"]).update(
                history=[*row["history"], {"at": "x", "event": "meanwhile"}],
                updated_at=timezone.now() + timedelta(seconds=1),
            )
            yield row

    monkeypatch.setattr(triage, "_rows", rows_then_change)
    result = triage.revive(DeferredWork.objects.filter(pk=work.pk), by="admin")

    assert [ref.pk for ref in result.changed] == [work.pk]
    work.refresh_from_db()
    assert [entry.get("event") for entry in work.history[-2:]] == ["meanwhile", "revived"]


def test_revive_reports_a_row_that_turned_pending_meanwhile_as_skipped(make_work, monkeypatch):
    work = make_work(Status.ABANDONED)
    real_rows = triage._rows

    def rows_then_revive_elsewhere(queryset):
        for row in real_rows(queryset):
            assert enqueueing._revive(row, timezone.now(), "default")  # enqueue's own revive
            yield row

    monkeypatch.setattr(triage, "_rows", rows_then_revive_elsewhere)
    result = triage.revive(DeferredWork.objects.filter(pk=work.pk), by="admin")

    assert result.changed == []
    assert [(ref.pk, ref.status) for ref in result.skipped] == [(work.pk, "pending")]
    work.refresh_from_db()
    assert [entry.get("by") for entry in work.history if entry.get("event") == "revived"] == ["enqueue"]


def test_revived_work_is_deduplicated_like_any_pending_work(make_work, workflow):
    work = make_work(Status.ABANDONED, dedupe_key="1", trigger={"key": 1})
    triage.revive(DeferredWork.objects.filter(pk=work.pk), by="admin")

    # enqueue on the same key finds it pending and returns it, trigger unchanged
    assert enqueue(workflow.kind, {"key": 1, "other": True}) == str(work.pk)
    work.refresh_from_db()
    assert work.trigger == {"key": 1}


def test_run_now_makes_pending_work_due_and_leaves_the_rest(make_work, stale_heartbeat):
    later = timezone.now() + timedelta(hours=2)
    waiting = make_work(Status.PENDING, attempt=1, next_attempt_at=later)
    running = make_work(Status.PROCESSING, next_attempt_at=later)
    abandoned = make_work(Status.ABANDONED, next_attempt_at=later)
    before = database_resolution_now()

    result = triage.run_now(DeferredWork.objects.all(), by="admin", user="alice")

    assert [ref.pk for ref in result.changed] == [waiting.pk]
    assert sorted(ref.pk for ref in result.skipped) == sorted([running.pk, abandoned.pk])
    waiting.refresh_from_db()
    assert before <= waiting.next_attempt_at <= timezone.now()
    assert waiting.attempt == 1  # only the wait moves
    assert waiting.status == Status.PENDING
    running.refresh_from_db()
    abandoned.refresh_from_db()
    assert running.next_attempt_at == later
    assert running.claim_token == "a" * 32
    assert abandoned.next_attempt_at == later
    assert abandoned.status == Status.ABANDONED


def test_run_now_never_touches_work_a_runner_claimed_meanwhile(make_work, monkeypatch):
    later = timezone.now() + timedelta(hours=2)
    work = make_work(Status.PENDING, next_attempt_at=later)
    real_rows = triage._rows

    def rows_then_claim(queryset):
        for row in real_rows(queryset):
            DeferredWork.objects.filter(pk=row["pk"]).update(status=Status.PROCESSING, claim_token="b" * 32)
            yield row

    monkeypatch.setattr(triage, "_rows", rows_then_claim)
    result = triage.run_now(DeferredWork.objects.filter(pk=work.pk), by="admin")

    assert result.changed == []
    assert [(ref.pk, ref.status) for ref in result.skipped] == [(work.pk, "processing")]
    work.refresh_from_db()
    assert work.next_attempt_at == later


def test_needs_attention_is_abandoned_plus_stale_processing(make_work, stale_heartbeat):
    abandoned = make_work(Status.ABANDONED)
    stale = make_work(Status.PROCESSING, heartbeat_at=stale_heartbeat)
    silent = make_work(Status.PROCESSING, heartbeat_at=None)
    make_work(Status.PROCESSING)  # heart-beating
    make_work(Status.PENDING)
    make_work(Status.DONE)

    found = set(DeferredWork.objects.filter(triage.needs_attention_q()).values_list("pk", flat=True))

    assert found == {abandoned.pk, stale.pk, silent.pk}


def test_unregistered_kinds_are_reported(make_work):
    known = make_work(Status.ABANDONED)
    unknown = make_work(Status.ABANDONED, kind="retired-kind")

    result = triage.revive(DeferredWork.objects.filter(pk__in=[known.pk, unknown.pk]), by="admin")

    assert len(result.changed) == 2
    assert result.unregistered_kinds == ["retired-kind"]


@pytest.mark.parametrize(
    ("by", "user", "words"),
    [
        ("admin", "alice", "in the admin by alice"),
        ("command line", "", "from the command line"),
        ("a script", "", "by a script"),
    ],
)
def test_the_log_line_says_where_a_triage_action_came_from_and_who_did_it(make_work, caplog, by, user, words):
    work = make_work(Status.ABANDONED)
    caplog.set_level("INFO", logger="nexus_workflows.triage")

    triage.revive(DeferredWork.objects.filter(pk=work.pk), by=by, user=user)

    assert f"#{work.pk} revived {words}" in caplog.text
    assert "admin admin" not in caplog.text


def test_revive_reports_a_row_deleted_between_its_reads_as_gone_with_its_id_and_kind(make_work):
    kept, deleted = make_work(Status.ABANDONED), make_work(Status.ABANDONED)

    with connection.execute_wrapper(delete_before_the_rows_are_read(deleted.pk)):
        result = triage.revive(DeferredWork.objects.filter(status=Status.ABANDONED), by="admin")

    assert [ref.pk for ref in result.changed] == [kept.pk]
    assert [(ref.pk, ref.kind, ref.status) for ref in result.skipped] == [(deleted.pk, deleted.kind, "gone")]
    assert "visit-" not in repr(result)  # no dedupe key, as for every ref

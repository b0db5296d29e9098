"""``manage.py workflows revive``: by id, by kind and key, or every abandoned item."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from nexus_workflows.models import DeferredWork, Status
from tests.admin.test_actions_gone_rows import delete_before_the_rows_are_read

pytestmark = pytest.mark.django_db


def revive(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("workflows", "revive", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def statuses() -> dict[int, str]:
    return dict(DeferredWork.objects.values_list("pk", "status"))


def test_by_ids_revives_abandoned_and_reports_the_rest(make_work, workflow):
    abandoned = make_work(Status.ABANDONED, dedupe_key="visit-1")
    done = make_work(Status.DONE, dedupe_key="visit-2")

    out, _ = revive(str(abandoned.pk), str(done.pk), "999999")

    assert out.splitlines() == [
        f"revived {workflow.kind} #{abandoned.pk}",
        f"skipped {workflow.kind} #{done.pk}: done, not abandoned",
        "skipped #999999: no such deferred work",
        "revived 1, skipped 2",
    ]
    assert "visit-" not in out  # keys may be patient data
    assert statuses() == {abandoned.pk: Status.PENDING, done.pk: Status.DONE}
    abandoned.refresh_from_db()
    assert abandoned.attempt == 0
    assert abandoned.last_error == ""
    assert abandoned.checkpoints == {"fetched": True}
    assert abandoned.history[-1]["event"] == "revived"
    assert abandoned.history[-1]["by"] == "command line"


def test_by_kind_and_key(make_work, workflow):
    target = make_work(Status.ABANDONED, dedupe_key="visit-7")
    same_key_other_kind = make_work(Status.ABANDONED, dedupe_key="visit-7", kind="other-kind")

    out, _ = revive("--kind", workflow.kind, "--key", "visit-7")

    assert out.splitlines()[-1] == "revived 1, skipped 0"
    assert statuses() == {target.pk: Status.PENDING, same_key_other_kind.pk: Status.ABANDONED}


def test_by_kind_and_key_that_does_not_exist(workflow):
    out, _ = revive("--kind", workflow.kind, "--key", "nope")

    assert out.splitlines() == [
        f"skipped: no deferred work of kind {workflow.kind!r} with that key",
        "revived 0, skipped 1: nothing to revive",
    ]


def test_a_kind_not_registered_here_is_not_repeated(make_work):
    # --kind and --key swapped: the "kind" is a dedupe key, which may be patient data.
    make_work(Status.ABANDONED, dedupe_key="+52 55 8731 4926")
    out, _ = revive("--kind", "+52 55 8731 4926", "--key", "demo-greet")
    assert out.splitlines() == [
        "skipped: no deferred work of the kind given (not registered here) with that key",
        "revived 0, skipped 1: nothing to revive",
    ]
    lines = revive("--all-abandoned", "--kind", "+52 55 8731 4926")[0].splitlines()
    assert lines[0] == "no abandoned work of the kind given (not registered here)"
    assert "8731" not in out + "".join(lines)


def test_processing_work_is_never_touched(make_work):
    running = make_work(Status.PROCESSING)
    before = DeferredWork.objects.filter(pk=running.pk).values().get()

    out, _ = revive(str(running.pk))

    assert "processing, not abandoned" in out
    assert DeferredWork.objects.filter(pk=running.pk).values().get() == before


def test_all_abandoned(make_work):
    abandoned = [make_work(Status.ABANDONED), make_work(Status.ABANDONED, kind="other-kind")]
    pending = make_work(Status.PENDING)

    out, err = revive("--all-abandoned")

    assert out.splitlines()[-1] == "revived 2, skipped 0"
    assert statuses() == {
        abandoned[0].pk: Status.PENDING,
        abandoned[1].pk: Status.PENDING,
        pending.pk: "pending",
    }
    assert "'other-kind'" in err  # not registered here: warned


def test_all_abandoned_of_one_kind(make_work, workflow):
    mine = make_work(Status.ABANDONED)
    other = make_work(Status.ABANDONED, kind="other-kind")

    out, err = revive("--all-abandoned", "--kind", workflow.kind)

    assert out.splitlines() == [
        f"revived {workflow.kind} #{mine.pk}",
        "revived 1, skipped 0",
    ]
    assert err == ""
    assert statuses() == {mine.pk: Status.PENDING, other.pk: Status.ABANDONED}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "say which work to revive in one way"),
        (("1", "--all-abandoned"), "say which work to revive in one way"),
        (("--key", "k"), "--key needs --kind"),
        (("--kind", "k"), "say which work to revive in one way"),
        (("1", "--kind", "k"), "--kind cannot be combined with ids"),
    ],
)
def test_ambiguous_requests_are_refused(make_work, args, message):
    work = make_work(Status.ABANDONED)

    with pytest.raises(CommandError, match=message):
        revive(*args)

    assert statuses() == {work.pk: Status.ABANDONED}


def test_keys_are_printed_only_with_reveal(make_work, workflow):
    abandoned = make_work(Status.ABANDONED, dedupe_key="visit-31")
    done = make_work(Status.DONE, dedupe_key="visit-32")

    out, _ = revive(str(abandoned.pk), str(done.pk), "--reveal")

    assert out.splitlines()[:2] == [
        f"revived {workflow.kind} #{abandoned.pk} (key visit-31)",
        f"skipped {workflow.kind} #{done.pk} (key visit-32): done, not abandoned",
    ]


def test_reveal_shows_no_key_for_a_row_gone_before_it_was_read(make_work, workflow):
    """Its key was never read: the line must not print an empty one as if it were the key."""
    kept = make_work(Status.ABANDONED, dedupe_key="visit-41")
    deleted = make_work(Status.ABANDONED, dedupe_key="visit-42")

    with connection.execute_wrapper(delete_before_the_rows_are_read(deleted.pk)):
        out, _ = revive("--all-abandoned", "--reveal")

    assert out.splitlines() == [
        f"revived {workflow.kind} #{kept.pk} (key visit-41)",
        f"skipped {workflow.kind} #{deleted.pk}: it is gone (purged or deleted)",
        "revived 1, skipped 1",
    ]

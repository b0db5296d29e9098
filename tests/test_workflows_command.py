from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork, Status

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("workflows", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def kind(register_workflow: Any) -> str:
    return register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind


def test_enqueue_prints_the_id_then_says_why_nothing_was_enqueued(kind: str) -> None:
    output = run("enqueue", kind, '{"key": "a", "visit": 3}')
    work = DeferredWork.objects.get()
    assert output.strip() == f"enqueued {kind} #{work.pk}"
    assert work.trigger == {"key": "a", "visit": 3}
    DeferredWork.objects.update(status=Status.DONE)
    assert "not enqueued: work with this dedupe key is already in flight or done" in run(
        "enqueue", kind, '{"key": "a"}'
    )


def test_enqueue_with_delay(kind: str) -> None:
    run("enqueue", kind, '{"key": "a"}', "--delay", "120")
    assert DeferredWork.objects.get().next_attempt_at > timezone.now() + timedelta(seconds=100)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "KIND", "{not json"], "TRIGGER-JSON is not valid JSON"),
        (["enqueue", "KIND", "{}", "--delay", "soon-s3cr3t"], "argument --delay: must be a number$"),
        (["enqueue", "KIND", '{"key": "a"}', "--delay", "1e300"], "delay is too long"),
        (["enqueue", "no-such-kind", "{}"], r"registered for the kind given \(a string of 12 "),
        (["enqueue", "KIND", '{"nokey": 1}'], "dedupe_key raised KeyError"),
        # json.loads raised ValueError (a traceback) for more digits than int() reads.
        (["enqueue", "KIND", '{"key": ' + "1" * 5000 + "}"], "has an integer too long to read"),
    ],
)
def test_enqueue_errors_are_command_errors(kind: str, args: list[str], message: str) -> None:
    args = [kind if arg == "KIND" else arg for arg in args]
    with pytest.raises(CommandError, match=message) as raised:
        run(*args)
    assert not DeferredWork.objects.exists()
    assert "no-such-kind" not in str(raised.value)
    assert "s3cr3t" not in str(raised.value)


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_enqueue_of_json_nested_too_deeply_is_a_command_error(kind: str, opening: str) -> None:
    """Not a RecursionError traceback from json.loads."""
    trigger = opening * 50_000 + "1" + ("]" if opening == "[" else "}") * 50_000
    with pytest.raises(CommandError, match="TRIGGER-JSON is nested too deeply: a trigger nests at most 64"):
        run("enqueue", kind, trigger)
    assert not DeferredWork.objects.exists()


@pytest.mark.parametrize(
    "ids",
    [
        ["99999999999999999999"],  # OverflowError on SQLite, beyond bigint on PostgreSQL
        ["9223372036854775808"],
        ["1", "0"],
        ["-1"],
        ["twelve"],
    ],
)
def test_revive_takes_ids_of_the_64_bit_range_only(ids: list[str]) -> None:
    with pytest.raises(CommandError, match="must be the id of deferred work: a whole number") as raised:
        run("revive", *ids)
    assert "of at least 1 and at most 9,223,372,036,854,775,807" in str(raised.value)
    assert repr(ids[-1]) not in str(raised.value)


def test_revive_of_the_largest_id_finds_no_such_work() -> None:
    output = run("revive", "9223372036854775807")
    assert "skipped #9223372036854775807: no such deferred work" in output


def test_status_counts_by_kind_and_lists_abandoned_and_oldest_due(kind: str) -> None:
    for key in "abc":
        enqueue(kind, {"key": key})
    DeferredWork.objects.filter(dedupe_key="a").update(
        status=Status.ABANDONED, last_error="PermanentError: HTTP 422\nTraceback detail", attempt=1
    )
    DeferredWork.objects.filter(dedupe_key="b").update(next_attempt_at=timezone.now() - timedelta(minutes=5))
    output = run("status")
    lines = output.splitlines()
    assert lines[0].split() == ["KIND", "PENDING", "PROCESSING", "DONE", "ABANDONED"]
    assert any(line.split() == [kind, "2", "0", "0", "1"] for line in lines)
    oldest = DeferredWork.objects.get(dedupe_key="b")
    assert f"Oldest due: {kind} #{oldest.pk} (attempt 1 of 2)" in output
    assert "Abandoned: 1" in output
    abandoned = DeferredWork.objects.get(dedupe_key="a")
    assert f"#{abandoned.pk} {kind} attempt 2 of 2 updated " in output
    assert "attempt 2 of 2 updated " in output
    assert ": PermanentError\n" in output  # the exception type only
    assert "key=" not in output  # dedupe keys may be patient data
    assert "HTTP 422" not in output
    assert "Traceback detail" not in output

    revealed = run("status", "--reveal")
    assert f"#{abandoned.pk} {kind} key=a attempt 2 of 2" in revealed
    assert "PermanentError: HTTP 422" in revealed
    assert "Traceback detail" not in revealed  # first line only


def test_status_of_an_empty_table() -> None:
    output = run("status")
    assert "No deferred work in the database." in output
    assert "Oldest due: nothing is due." in output


def test_status_shows_live_runners_wakeup_modes_only() -> None:
    from nexus_workflows.observability.models import Runner

    now = timezone.now()

    def runner(host: str, pid: int, mode: str, seen: Any) -> None:
        Runner.objects.create(
            host=host,
            pid=pid,
            version="0",
            kinds=[],
            concurrency=1,
            started_at=seen,
            last_seen_at=seen,
            wakeup_mode=mode,
            wakeup_mode_since=seen,
        )

    runner("web-1", 41, "listening", now)
    runner("web-2", 42, "short-poll", now)
    runner("web-3", 43, "listening", now - timedelta(seconds=301))  # STALE_AFTER is 300 s
    output = run("status")
    assert "Runners' wake-ups: 2" in output
    assert "web-1:41 listening since" in output
    assert "web-2:42 short-poll since" in output
    assert "behind a pooler, set WAKEUP_DATABASE" in output
    assert "web-3:43" not in output  # not seen for STALE_AFTER: stopped without cleaning up


def test_status_without_listening_runners_says_so() -> None:
    assert "Runners' wake-ups: no runner listening" in run("status")


def test_enqueue_of_a_fire_and_forget_job_prints_its_id_only_with_reveal(rq_redis: Any) -> None:
    """The job id is ``<kind>__<dedupe key>``, and keys may be patient data."""
    output = run("enqueue", "test-ff-ledger", '{"key": "5512345678"}')
    assert "5512345678" not in output
    assert output.strip() == (
        "enqueued a test-ff-ledger job (--reveal prints its id, which carries the dedupe key)"
    )
    assert run("enqueue", "test-ff-ledger", '{"key": "5587654321"}', "--reveal").strip() == (
        "enqueued job test-ff-ledger__5587654321"
    )


def _due_row(kind: str, key: str, **fields: Any) -> DeferredWork:
    return DeferredWork.objects.create(
        kind=kind, dedupe_key=key, trigger={}, next_attempt_at=timezone.now() - timedelta(minutes=1), **fields
    )


def test_status_counts_due_work_of_kinds_no_runner_here_knows(kind: str) -> None:
    """A kind removed from the code, and a Django task whose module is gone, leave due rows
    that nothing claims: they stay pending for ever. Status names those kinds with their
    counts (kinds are code, not patient data); registered kinds and tasks that load are
    not listed, nor work that is not due yet."""
    _due_row(kind, "registered")
    for key in ("a", "b"):
        _due_row("reminders.removed-kind", key)
    _due_row("reminders.removed-kind", "later").__class__.objects.filter(dedupe_key="later").update(
        next_attempt_at=timezone.now() + timedelta(hours=1)
    )
    task = {"backend_name": "default", "queue_name": "default"}
    _due_row("tests.testapp.tasks.add", "task-loads", **task)
    _due_row("tests.testapp.gone_module.send", "task-gone", **task)
    output = run("status")
    assert "Due, but no runner here knows the kind (3;" in output
    lines = output.splitlines()
    assert any(line.split() == ["reminders.removed-kind", "2"] for line in lines)
    assert any(line.split() == ["tests.testapp.gone_module.send", "1"] for line in lines)
    listed = output.split("Due, but no runner here knows the kind")[1].split("Abandoned:")[0]
    assert kind not in listed
    assert "tests.testapp.tasks.add" not in listed
    assert "task-gone" not in output  # dedupe keys are never printed


def test_status_says_nothing_of_unknown_kinds_when_every_due_kind_is_known(kind: str) -> None:
    _due_row(kind, "a")
    assert "no runner here knows" not in run("status")

"""``nexus_workflows.signals``: what is sent, in which order, and what a failing receiver does."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from nexus_workflows import EnqueueRejected, PermanentError, enqueue, enqueue_many, signals
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.deferred.triage import revive
from nexus_workflows.models import DeferredWork, Status

pytestmark = pytest.mark.django_db(transaction=True)

ALL = ("work_enqueued", "attempt_started", "attempt_finished", "work_abandoned", "work_revived")


class Upstream(Exception):
    pass


@pytest.fixture
def received() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    events: list[tuple[str, dict[str, Any]]] = []
    receivers = []
    for name in ALL:

        def receiver(sender: Any, signal: Any, name: str = name, **kwargs: Any) -> None:
            assert sender is DeferredWork
            events.append((name, kwargs))

        getattr(signals, name).connect(receiver, weak=False)
        receivers.append((name, receiver))
    yield events
    for name, receiver in receivers:
        getattr(signals, name).disconnect(receiver)


def run_once(kind: str) -> Any:
    return Runner(once=True, kinds=[kind], install_signal_handlers=False).run()


def test_a_failing_then_abandoned_then_revived_item_sends_every_signal_in_order(
    register_workflow: Any, received: list[tuple[str, dict[str, Any]]]
) -> None:
    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        if trigger["run"] == 1:
            raise Upstream(f"patient {trigger['name']} unknown")
        raise PermanentError("rejected")

    kind = register_workflow(prepare, retry_schedule=[1, 1]).kind
    work_id = int(enqueue(kind, {"key": "a", "run": 1, "name": "María"}))
    run_once(kind)
    DeferredWork.objects.filter(pk=work_id).update(
        trigger={"key": "a", "run": 2, "name": "María"}, next_attempt_at=DeferredWork.objects.get().created_at
    )
    run_once(kind)
    assert DeferredWork.objects.get(pk=work_id).status == Status.ABANDONED
    revive(DeferredWork.objects.filter(pk=work_id), by="test")
    DeferredWork.objects.filter(pk=work_id).update(status=Status.ABANDONED)
    assert enqueue(kind, {"key": "a", "run": 3, "name": "María"}) == str(work_id)  # revived by enqueue

    names = [name for name, _ in received]
    assert names == [
        "work_enqueued",
        "attempt_started",
        "attempt_finished",
        "attempt_started",
        "attempt_finished",
        "work_abandoned",
        "work_revived",
        "work_revived",
    ]
    common = {"kind": kind, "id": work_id}
    payloads = [kwargs for _, kwargs in received]
    assert payloads[0] == {**common, "attempt": 1}
    assert payloads[1] == {**common, "attempt": 1}
    first_finish = payloads[2]
    assert first_finish["outcome"] == "rescheduled"
    assert isinstance(first_finish["duration"], float)
    assert first_finish["duration"] >= 0
    assert {key: first_finish[key] for key in ("kind", "id", "attempt")} == {**common, "attempt": 1}
    assert payloads[3] == {**common, "attempt": 2}
    assert payloads[4]["outcome"] == "abandoned"
    assert payloads[4]["attempt"] == 2
    assert payloads[5] == {**common, "attempt": 2}
    assert payloads[6] == {**common, "attempt": 1}
    assert payloads[7] == {**common, "attempt": 1}
    # Kind, id, attempt, outcome and duration only: never the trigger or the error.
    assert "María" not in repr(received)
    assert "rejected" not in repr(received)


def test_a_success_sends_started_then_finished_done(
    register_workflow: Any, received: list[tuple[str, dict[str, Any]]]
) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    work_id = int(enqueue(kind, {"key": "a"}))
    run_once(kind)
    assert [(name, kwargs.get("outcome")) for name, kwargs in received] == [
        ("work_enqueued", None),
        ("attempt_started", None),
        ("attempt_finished", "done"),
    ]
    assert received[2][1]["id"] == work_id


def test_enqueue_many_announces_new_rows_only(
    register_workflow: Any, received: list[tuple[str, dict[str, Any]]]
) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    existing = int(enqueue(kind, {"key": "a"}))
    received.clear()
    results = enqueue_many(kind, [{"key": "a"}, {"key": "b"}, {"key": "c"}, {"key": "b"}])
    assert results[0] == str(existing)
    new = {int(results[1]), int(results[2])}
    assert [name for name, _ in received] == ["work_enqueued", "work_enqueued"]
    assert {kwargs["id"] for _, kwargs in received} == new


def test_enqueue_many_announces_nothing_of_a_batch_that_was_refused_and_rolled_back(
    register_workflow: Any, received: list[tuple[str, dict[str, Any]]], project_refusal: Any
) -> None:
    """No caller transaction: a signal then means a committed write. The first chunk of
    500 (a new row, a revived one) is written before the second is refused; the whole
    batch rolls back, so neither may have been announced."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    abandoned = int(enqueue(kind, {"key": "k-0"}))
    DeferredWork.objects.filter(pk=abandoned).update(status=Status.ABANDONED)
    project_refusal.install("dedupe_key", "forbidden-key")
    received.clear()
    triggers = [{"key": f"k-{n}"} for n in range(500)] + [{"key": "forbidden-key"}]
    with pytest.raises(EnqueueRejected):
        enqueue_many(kind, triggers)
    assert list(DeferredWork.objects.values_list("pk", "status")) == [(abandoned, Status.ABANDONED)]
    assert received == []
    # And a batch that is written is announced, revived row included.
    enqueue_many(kind, triggers[:2])
    assert sorted(name for name, _ in received) == ["work_enqueued", "work_revived"]


def test_a_receiver_that_raises_is_logged_by_type_and_breaks_nothing(
    register_workflow: Any, caplog: Any
) -> None:
    calls: list[str] = []

    def broken(sender: Any, **kwargs: Any) -> None:
        calls.append(kwargs["kind"])
        raise ValueError("receiver choked on +52 55 1234 5678")

    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    for signal in (signals.work_enqueued, signals.attempt_started, signals.attempt_finished):
        signal.connect(broken)
    try:
        with caplog.at_level(logging.ERROR, logger="nexus_workflows"):
            work_id = enqueue(kind, {"key": "a"})
            assert work_id is not None
            stats = run_once(kind)
    finally:
        for signal in (signals.work_enqueued, signals.attempt_started, signals.attempt_finished):
            signal.disconnect(broken)
    assert stats.done == 1
    assert DeferredWork.objects.get(pk=work_id).status == Status.DONE
    assert calls == [kind, kind, kind]
    messages = [record.getMessage() for record in caplog.records if record.name == "nexus_workflows.signals"]
    where = (
        "test_a_receiver_that_raises_is_logged_by_type_and_breaks_nothing.<locals>.broken, test_signals.py"
    )
    assert [message.split(":")[0] for message in messages] == [
        f"a receiver of work_enqueued raised ValueError for {kind} #{work_id}; ignored ({where}",
        f"a receiver of attempt_started raised ValueError for {kind} #{work_id}; ignored ({where}",
        f"a receiver of attempt_finished raised ValueError for {kind} #{work_id}; ignored ({where}",
    ]
    assert all(message.endswith(" in broken)") for message in messages)
    # Django's own record of the exception (message and traceback) is not emitted.
    assert "5678" not in caplog.text


@pytest.mark.parametrize("exit_error", [SystemExit, KeyboardInterrupt])
def test_a_receiver_raising_an_exit_in_a_runner_is_logged_by_type_and_the_runner_goes_on(
    register_workflow: Any, caplog: Any, exit_error: type[BaseException]
) -> None:
    """send_robust() lets SystemExit and KeyboardInterrupt through: a receiver raising one
    ended the runner (printing its message) before the next item ran."""

    def exiting(sender: Any, **kwargs: Any) -> None:
        raise exit_error("receiver quit on María López")

    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    ids = [enqueue(kind, {"key": key}) for key in "ab"]
    runner_signals = (signals.attempt_started, signals.attempt_finished)
    for signal in runner_signals:
        signal.connect(exiting)
    try:
        with caplog.at_level(logging.ERROR, logger="nexus_workflows"):
            # In a thread of its own, so that a runner that escapes or hangs fails the test
            # instead of ending or stalling the session (before the fix, the worker thread
            # died with the exit and the runner waited for it for good).
            outcome: dict[str, Any] = {}

            def run() -> None:
                try:
                    outcome["stats"] = run_once(kind)
                except BaseException as escaped:  # noqa: BLE001 - reported below
                    outcome["escaped"] = type(escaped).__name__

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            thread.join(60)
    finally:
        for signal in runner_signals:
            signal.disconnect(exiting)
    assert not thread.is_alive(), "the runner hung after a receiver's exit"
    assert "escaped" not in outcome
    stats = outcome["stats"]
    assert stats.done == 2
    assert set(DeferredWork.objects.filter(pk__in=ids).values_list("status", flat=True)) == {Status.DONE}
    messages = [record.getMessage() for record in caplog.records if record.name == "nexus_workflows.signals"]
    assert len(messages) == 4
    assert all(f"raised {exit_error.__name__} for {kind} #" in message for message in messages)
    assert "María" not in caplog.text


def test_a_receiver_raising_an_exit_outside_a_runner_is_not_swallowed(register_workflow: Any) -> None:
    """In a web process or a shell, SystemExit and Ctrl-C must still end what they end."""

    def exiting(sender: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    signals.work_enqueued.connect(exiting)
    try:
        with pytest.raises(KeyboardInterrupt):
            enqueue(kind, {"key": "a"})
    finally:
        signals.work_enqueued.disconnect(exiting)


def test_sending_with_no_receiver_builds_nothing() -> None:
    # No receiver: send() returns before it imports the model or builds keyword arguments.
    assert not signals.attempt_started.receivers
    signals.send(signals.attempt_started, kind="k", id="not a number", attempt=1)  # int() not reached

"""A runner ignores a wake-up that names a row, or an ended attempt, of a kind it does not
run (its ``kinds``/``queues`` leave it out): no claim for it. A wake-up naming no row (many
rows, a revive, a release, the waiting lock taken) still makes every runner claim, and one
naming a kind it runs does what it did.

The listener's handling of each payload is checked on its own (``_received``, the method
its thread calls for each notification); two runner threads on real PostgreSQL show the
claims: the runner of the other kind makes none while the first drains its rows."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings

from nexus_workflows import enqueue
from nexus_workflows.deferred import transitions, wakeup
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.deferred.runner.ledger import SYNC
from nexus_workflows.models import DeferredWork, Status
from tests.flow.test_lane_claims import BusyLane
from tests.processes import wait_for
from tests.runner.helpers import lane_claims
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


class CountedEvent(threading.Event):
    """The runner's wake event, counting its ``set`` calls and saying when the runner's loop
    waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.sets = 0
        self.waiting = False

    def set(self) -> None:
        self.sets += 1
        super().set()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting = True
        try:
            return super().wait(timeout)
        finally:
            self.waiting = False


def test_the_listener_wakes_its_runner_only_for_rows_and_ends_of_kinds_it_runs(
    register_workflow: Any,
) -> None:
    limited = register_workflow(noop, retry_schedule=[1], concurrency=1).kind
    plain = register_workflow(noop, retry_schedule=[1]).kind
    other = register_workflow(noop, retry_schedule=[1], concurrency=1).kind
    busy = BusyLane([limited, plain])  # takes no Django tasks (queues [])
    event = CountedEvent()
    listener = wakeup.PostgresListener(
        "default",
        event,
        on_new_work=busy.lanes.new_work,
        on_kind_ended=getattr(busy.lanes, "kind_ended", None),
        on_any_work=busy.lanes.wake_limited,
    )
    # Rows and ends of kinds it does not run, a Django task (it takes no queue): nothing.
    for payload in (f"7 {other}", "8 myapp.tasks.send", f"ended {other}", f"9 {other}"):
        listener._received(payload)
    assert event.sets == 0
    assert busy.lanes.claim_notified(None) == 0
    # A kind it runs, and payloads naming no row: each wakes it.
    enqueue(limited, {"key": "a"})
    assert busy.lanes.claim_due(None)[0] == 1  # its one slot held from now on
    enqueue(limited, {"key": "b"})
    assert busy.lanes.claim_due(None)[0] == 0  # every slot held: the kind rests
    listener._received(f"ended {limited}")
    assert event.sets == 1
    transitions.finish_done(busy.handed_out)  # (as another runner's attempt ended)
    assert busy.lanes.claim_due(None)[0] == 1  # the rest ended: asked, and "b" starts
    work_id = int(enqueue(plain, {"key": "p"}) or 0)
    listener._received(f"{work_id} {plain}")
    listener._received("")
    assert event.sets == 3


def claims_counted(runner: Runner) -> list[int]:
    """Wrap the runner's claim of due work (run on its own thread) so that each call's
    statements are counted, on the connection that thread uses."""
    counts: list[int] = []
    claim_due = runner._lanes.claim_due

    def counted(cutoff: Any) -> tuple[int, bool, int]:
        with CaptureQueriesContext(connection) as queries:
            result = claim_due(cutoff)
        counts.append(len(queries))
        return result

    runner._lanes.claim_due = counted  # type: ignore[method-assign]
    return counts


def start(runner: Runner) -> threading.Thread:
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    wait_for(
        lambda: runner._listener is not None and runner._listener.ready_to_wait(), timeout=15, what="waiting"
    )
    # As if the enqueues below came from another process (a web worker): only the
    # NOTIFY wakes this runner, not the in-process wake-up of runners beside the enqueue.
    wakeup.remove_local_waiter(runner._wake)
    return thread


@contextlib.contextmanager
def started(runners: Iterable[Runner]) -> Iterator[None]:
    """``runners`` running, each on a thread of its own and waiting for work (:func:`start`);
    stopped at the end of the block, their threads ended."""
    runners = list(runners)
    threads = [start(runner) for runner in runners]
    try:
        yield
    finally:
        for runner in runners:
            runner.request_stop()
        for thread in threads:
            thread.join(15)
    assert not any(thread.is_alive() for thread in threads)


def done(work_id: int) -> bool:
    return DeferredWork.objects.get(pk=work_id).status == Status.DONE


def task_done(result: Any) -> bool:
    """Whether a Django task's row is done (its result id is the row's dedupe key)."""
    return DeferredWork.objects.exclude(queue_name="").get(dedupe_key=result.id).status == Status.DONE


def idle(runner: Runner, event: CountedEvent) -> bool:
    return (
        event.waiting
        and not event.is_set()
        and runner._listener is not None
        and runner._listener.ready_to_wait()
    )


@pytest.mark.postgresql
@override_settings(NEXUS_WORKFLOWS={"POLL_INTERVAL": 60})
def test_a_runner_makes_no_claim_for_rows_of_a_kind_another_runner_runs(register_workflow: Any) -> None:
    ours = register_workflow(noop, retry_schedule=[1]).kind
    theirs = register_workflow(noop, retry_schedule=[1]).kind
    runners = {
        kind: Runner(kinds=[kind], concurrency=2, install_signal_handlers=False) for kind in (ours, theirs)
    }
    events: dict[str, CountedEvent] = {}
    for kind, runner in runners.items():
        events[kind] = CountedEvent()
        runner._wake = events[kind]
    counts = claims_counted(runners[ours])
    with started(runners.values()):
        # A row of its own first: once it is done and the runner waits, nothing is pending.
        own = int(enqueue(ours, {"key": "own"}) or 0)
        wait_for(functools.partial(done, own), timeout=15, what="own row done")
        wait_for(lambda: idle(runners[ours], events[ours]), timeout=15, what="our runner idle")
        before = len(counts)
        for number in range(5):  # one at a time: each its own NOTIFY, each a wake-up
            work_id = int(enqueue(theirs, {"key": number}) or 0)
            wait_for(functools.partial(done, work_id), timeout=15, what="their row done")
        wait_for(lambda: idle(runners[ours], events[ours]), timeout=15, what="our runner idle again")
        assert counts[before:] == []  # no claim, no statement, for their five rows
        # A row of ours still wakes it at once (the poll is a minute away).
        own = int(enqueue(ours, {"key": "own-2"}) or 0)
        wait_for(functools.partial(done, own), timeout=15, what="own row done")


def test_parse_ended_reads_only_the_ended_payload() -> None:
    assert wakeup.parse_ended("ended send-reminder") == "send-reminder"
    for payload in ("", "ended", "ended ", "42 send-reminder", "probe:ended x"):
        assert wakeup.parse_ended(payload) is None
    assert wakeup.parse_new_work("ended send-reminder") is None


def test_the_listener_wakes_a_runner_of_some_queues_only_for_tasks_of_those(
    register_workflow: Any,
) -> None:
    """A Django task's NOTIFY names its queue (migration 0021): a runner that takes only
    some queues (``runworkflows --queue``) ignores a task of another; one that names no
    queue (a NOTIFY of an earlier release) it still claims by id, queue re-checked."""
    lanes, _ = lane_claims(kinds=[], queues=["emails"])
    event = CountedEvent()
    listener = wakeup.PostgresListener("default", event, on_new_work=lanes.new_work)
    listener._received("8 myapp.tasks.send reports")
    listener._received("9 myapp.tasks.send default")
    assert event.sets == 0
    assert lanes.claim_notified(None) == 0
    for payload in ("10 myapp.tasks.send emails", "11 myapp.tasks.send"):
        listener._received(payload)
    assert event.sets == 2
    assert [work_id for work_id, _ in lanes._notified[SYNC]] == [10, 11]


@pytest.mark.postgresql
@override_settings(NEXUS_WORKFLOWS={"POLL_INTERVAL": 60})
def test_a_runner_makes_no_claim_for_tasks_of_a_queue_another_runner_takes() -> None:
    runners = {
        queue: Runner(queues=[queue], concurrency=2, install_signal_handlers=False)
        for queue in ("emails", "reports")
    }
    events: dict[str, CountedEvent] = {}
    for queue, runner in runners.items():
        events[queue] = CountedEvent()
        runner._wake = events[queue]
    counts = claims_counted(runners["emails"])
    with started(runners.values()):
        own = tasks.record.using(queue_name="emails").enqueue("own")
        wait_for(functools.partial(task_done, own), timeout=15, what="own task done")
        wait_for(lambda: idle(runners["emails"], events["emails"]), timeout=15, what="emails runner idle")
        before, sets = len(counts), events["emails"].sets
        for number in range(5):  # one at a time: each its own NOTIFY naming its queue
            report = tasks.record.using(queue_name="reports").enqueue(f"report-{number}")
            wait_for(functools.partial(task_done, report), timeout=15, what="report task done")
        wait_for(
            lambda: idle(runners["emails"], events["emails"]), timeout=15, what="emails runner idle again"
        )
        assert counts[before:] == []  # no claim, no statement, for the other queue's tasks
        assert events["emails"].sets == sets  # not even woken
        # A task of its own queue still wakes it at once (the poll is a minute away).
        email = tasks.record.using(queue_name="emails").enqueue("email")
        wait_for(functools.partial(task_done, email), timeout=15, what="email task done")

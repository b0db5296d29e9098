"""``async def`` prepares on the runner's own event loop, and every ``save()`` through the
journal writer over at most ``DB_CONNECTIONS`` connections (issue 12). In-process runners
on the real database; connections are counted in ``pg_stat_activity``."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from nexus_workflows import ClaimLost, enqueue_many
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.deferred.wakeup import parse_new_work
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.sql.returning import can_return_from_update
from tests.processes import wait_for
from tests.raw_connections import raw_connection

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.2, "STALE_AFTER": 5.0, "SHUTDOWN_GRACE": 5}


@contextmanager
def running(kinds: list[str], **options: Any) -> Iterator[Runner]:
    """A runner in a thread of this process; stopped (and checked to stop) on exit."""
    runner = Runner(kinds=kinds, install_signal_handlers=False, **options)
    thread = threading.Thread(target=runner.run, name="test-runner")
    thread.start()
    try:
        yield runner
    finally:
        runner.request_stop()
        thread.join(20)
        connection.close()
    assert not thread.is_alive()


class Gate:
    """What attempts wait on, and who is waiting (the test's side of the attempts)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.waiting: set[int] = set()
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def arrived(self, key: int) -> None:
        with self.lock:
            self.waiting.add(key)
            self.threads.add(threading.current_thread().name)

    async def wait(self, key: int) -> None:
        self.arrived(key)
        deadline = time.monotonic() + 60
        while not self.open.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def count(self) -> int:
        with self.lock:
            return len(self.waiting)


class ConnectionCounter:
    """Samples, on a connection of its own, how many sessions the test database has
    beyond those it had before (the test's own): the peak is what a runner held."""

    def __init__(self) -> None:
        self._connection = raw_connection(prepare_threshold=None)
        self.baseline = self.sessions()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="connection-counter", daemon=True)

    def sessions(self) -> int:
        sql = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return self._connection.execute(sql).fetchone()[0]

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sessions() - self.baseline)
            self._stop.wait(0.01)

    def __enter__(self) -> ConnectionCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._connection.close()


def test_async_attempts_run_concurrently_on_one_thread_of_the_runner(register_workflow: Any) -> None:
    gate = Gate()

    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await gate.wait(trigger["key"])
        await save({"done": True})

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": n} for n in range(60)])
    threads_before = threading.active_count()
    with (
        override_settings(NEXUS_WORKFLOWS=FAST),
        running([kind], concurrency=2, async_concurrency=60) as runner,
    ):
        wait_for(lambda: gate.count() == 60, timeout=30, what="60 attempts in flight")
        # One loop thread; a thread per attempt would add 60.
        assert gate.threads == {"nexus-workflows-async"}
        assert threading.active_count() - threads_before < 20
        gate.open.set()
        wait_for(lambda: runner.stats.done == 60, timeout=30, what="all 60 done")
    journals = list(DeferredWork.objects.filter(kind=kind).values_list("checkpoints", flat=True))
    assert journals == [{"done": True}] * 60


def test_an_async_attempt_that_lost_its_claim_gets_claim_lost_from_await_save(register_workflow: Any) -> None:
    gate = Gate()
    seen: list[BaseException] = []

    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await save({"before": True})
        await gate.wait(trigger["key"])
        try:
            await save({"after": True})
        except ClaimLost as error:
            seen.append(error)
            raise

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    (work_id,) = enqueue_many(kind, [{"key": 1}])
    with override_settings(NEXUS_WORKFLOWS=FAST), running([kind], async_concurrency=4) as runner:
        wait_for(lambda: gate.count() == 1, timeout=30, what="the attempt to wait")
        # Another runner (or an operator) took the work over.
        DeferredWork.objects.filter(pk=work_id).update(claim_token="someone-else")
        gate.open.set()
        wait_for(lambda: runner.stats.lost == 1, timeout=30, what="the lost claim")
    assert [type(error) for error in seen] == [ClaimLost]
    work = DeferredWork.objects.get(pk=work_id)
    assert (work.claim_token, work.checkpoints, work.status) == (
        "someone-else",
        {"before": True},
        Status.PROCESSING,
    )


def test_each_lane_claims_only_as_far_as_its_own_slots(register_workflow: Any) -> None:
    """Sync work is not claimed for free async slots (nor the other way round): a row
    claimed for a busy thread pool would wait in this runner while others could run it."""
    sync_gate, async_gate = threading.Event(), Gate()

    def blocking(trigger: Any, checkpoints: Any, save: Any) -> None:
        sync_gate.wait(30)

    async def waiting(trigger: Any, checkpoints: Any, save: Any) -> None:
        await async_gate.wait(trigger["key"])

    sync_kind = register_workflow(blocking, retry_schedule=[1]).kind
    async_kind = register_workflow(waiting, retry_schedule=[1]).kind
    enqueue_many(sync_kind, [{"key": n} for n in range(6)])
    enqueue_many(async_kind, [{"key": n} for n in range(12)])

    def processing(kind: str) -> int:
        return DeferredWork.objects.filter(kind=kind, status=Status.PROCESSING).count()

    with (
        override_settings(NEXUS_WORKFLOWS=FAST),
        running([sync_kind, async_kind], concurrency=1, async_concurrency=8) as runner,
    ):
        wait_for(lambda: async_gate.count() == 8, timeout=30, what="8 async attempts in flight")
        time.sleep(0.3)  # several polls: nothing more may be claimed
        assert (processing(sync_kind), processing(async_kind)) == (1, 8)
        sync_gate.set()
        async_gate.open.set()
        wait_for(lambda: runner.stats.done == 18, timeout=30, what="all 18 done")


def test_a_runner_has_a_backlog_only_while_every_lane_got_all_it_asked_for(register_workflow: Any) -> None:
    """What tells a runner's listener to let the waiting lock go (enqueues then skip their
    NOTIFY): every lane's last claim was full; a lane with no room keeps its last answer."""
    from nexus_workflows.deferred.runner.capacity import Capacity
    from nexus_workflows.deferred.runner.lanes import LaneClaims, lane_of
    from nexus_workflows.deferred.runner.ledger import ASYNC, SYNC, Ledger

    async def waiting(trigger: Any, checkpoints: Any, save: Any) -> None:
        pass

    sync_kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    async_kind = register_workflow(waiting, retry_schedule=[1]).kind
    ledger = Ledger(lane_of)
    lanes = LaneClaims(
        kinds=[sync_kind, async_kind],
        queues=[],
        using="default",
        worker_id="test-backlog",
        ledger=ledger,
        capacity={SYNC: Capacity(1, 1), ASYNC: Capacity(1, 1)},
        claimed=ledger.dispatch,
        reclaimed=ledger.add_unguarded,
    )
    assert not lanes.backlogged()  # nothing claimed yet
    enqueue_many(sync_kind, [{"key": 1}, {"key": 2}])
    assert lanes.claim_due(None)[0] == 1
    assert not lanes.backlogged()  # the async lane found nothing: it would wait for a NOTIFY
    enqueue_many(async_kind, [{"key": 1}, {"key": 2}])
    # The sync lane holds its one item (no room): it does not claim, and keeps its backlog.
    assert lanes.claim_due(None)[0] == 1
    assert lanes.backlogged()
    (started,) = ledger.take_now(ASYNC, 1)
    ledger.finished(started)
    assert lanes.claim_due(None)[0] == 1  # the async lane's second item: full again
    assert lanes.backlogged()
    (started,) = ledger.take_now(ASYNC, 1)
    ledger.finished(started)
    assert lanes.claim_due(None)[0] == 0
    assert not lanes.backlogged()  # the async lane's last claim came back short


@pytest.mark.postgresql
@pytest.mark.parametrize(
    ("mode", "in_flight", "db_connections"),
    [("async", 500, 5), ("sync", 32, 4), ("async-rate-limited", 200, 5)],
)
def test_attempts_in_flight_with_saves_never_hold_more_connections_than_the_setting(
    register_workflow: Any, mode: str, in_flight: int, db_connections: int
) -> None:
    """A rate-limited kind's async starts run on the journal writers too: on asyncio's
    default thread pool they held a connection per thread (14 sessions for 8 allowed)."""
    gate = Gate()
    release = threading.Event()

    async def async_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await save({"step": 1})
        await gate.wait(trigger["key"])
        await save({"step": 2})

    def sync_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        save({"step": 1})
        gate.arrived(trigger["key"])
        release.wait(60)
        save({"step": 2})

    prepare: Callable[..., Any] = sync_prepare if mode == "sync" else async_prepare
    flow = {"rate_limit": (10_000, 1.0)} if mode == "async-rate-limited" else {}
    kind = register_workflow(prepare, retry_schedule=[1], **flow).kind
    enqueue_many(kind, [{"key": n} for n in range(in_flight)])
    settings = {**FAST, "DB_CONNECTIONS": db_connections}
    options = {"concurrency": in_flight} if mode == "sync" else {"async_concurrency": in_flight}
    with override_settings(NEXUS_WORKFLOWS=settings), ConnectionCounter() as counter:
        with running([kind], **options) as runner:
            wait_for(lambda: gate.count() == in_flight, timeout=60, what=f"{in_flight} attempts in flight")
            gate.open.set()
            release.set()
            wait_for(lambda: runner.stats.done == in_flight, timeout=60, what="all done")
        peak = counter.peak
    assert peak <= db_connections, f"{peak} connections for DB_CONNECTIONS = {db_connections}"
    # Through a pooler (bin/test's PgBouncer leg) the runner may reuse server sessions the
    # baseline already counted; a pooler never opens more than its clients, so the bound
    # above still holds. Directly, the runner's own sessions must have been seen.
    if not os.environ.get("DIRECT_DATABASE_URL"):
        assert peak >= 1
    journals = list(DeferredWork.objects.filter(kind=kind).values_list("checkpoints", flat=True))
    assert journals == [{"step": 2}] * in_flight


@pytest.mark.postgresql
def test_the_wake_up_listener_opens_no_connection_of_its_own_beyond_its_listen(
    register_workflow: Any,
) -> None:
    """The listener's probe (and the runner row it updates on a mode change) run on a
    journal writer's connection. On the old code they opened one of the listener thread's
    own, closed after: with the writers' connections that was DB_CONNECTIONS + 1 for a
    moment, and the bound test above failed so in CI (5 sessions for 4)."""
    from django.db.backends.signals import connection_created

    threads: list[str] = []

    def opened(sender: Any, connection: Any, **kwargs: Any) -> None:
        threads.append(threading.current_thread().name)

    kind = register_workflow(lambda t, c, s: s({"step": 1}), retry_schedule=[1]).kind
    connection_created.connect(opened, weak=False)
    try:
        # "direct": the LISTEN straight to PostgreSQL also in bin/test's PgBouncer leg.
        settings = {**FAST, "WAKEUP_DATABASE": "direct"}
        with override_settings(NEXUS_WORKFLOWS=settings), running([kind]) as runner:
            wait_for(lambda: runner.wakeup_mode.name == "LISTENING", timeout=30, what="wake-ups")
            enqueue_many(kind, [{"key": n} for n in range(3)])
            wait_for(lambda: runner.stats.done == 3, timeout=30, what="the work done")
    finally:
        connection_created.disconnect(opened)
    assert threads  # the runner's connections were seen
    assert [name for name in threads if "listener" in name] == []


# --- wake-up by id (issue 12, item 3) ------------------------------------------------------


def test_a_row_named_by_its_notify_is_claimed_by_id_only_while_it_is_pending_due_and_ours(
    register_workflow: Any,
) -> None:
    mine = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    other = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    due, later = map(int, enqueue_many(mine, [{"key": 1}, {"key": 2}]))
    DeferredWork.objects.filter(pk=later).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    foreign = int(enqueue_many(other, [{"key": 1}])[0])
    claimer = Claimer(kinds=[mine], using="default")
    assert claimer.takes_by_id(mine)
    assert not claimer.takes_by_id(other)
    (claimed,) = claimer.claim_due_ids([due, later, foreign])
    assert (claimed.id, claimed.kind, claimed.attempt) == (due, mine, 0)
    assert DeferredWork.objects.get(pk=due).claim_token == claimed.claim_token
    assert claimer.claim_due_ids([due]) == []  # already processing: never twice
    statuses = dict(DeferredWork.objects.filter(pk__in=[later, foreign]).values_list("pk", "status"))
    assert statuses == {later: Status.PENDING, foreign: Status.PENDING}


# One due row of ours among three that are not: four ids, the precompiled claim; six due
# rows: nine ids, beyond the precompiled sizes, the ORM's claim. Either takes the same.
@pytest.mark.parametrize("count", [1, 6])
def test_the_claim_of_notified_workflow_rows_takes_only_pending_due_rows_of_its_kinds(
    register_workflow: Any, count: int
) -> None:
    mine = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    other = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    ids = [int(pk) for pk in enqueue_many(mine, [{"key": n} for n in range(count + 1)])]
    later = ids.pop()
    DeferredWork.objects.filter(pk=later).update(next_attempt_at=timezone.now() + timedelta(hours=1))
    foreign = int(enqueue_many(other, [{"key": 1}])[0])
    task = DeferredWork.objects.create(
        kind="tests.testapp.tasks.noop", dedupe_key="t", trigger={}, queue_name="q"
    )
    claimer = Claimer(kinds=[mine], queues=None, using="default")
    wanted = list(reversed(ids))
    for _ in range(2):  # the second call runs the statement the first compiled
        claimed = claimer.claim_workflow_ids([*wanted, later, foreign, task.pk])
        assert [work.id for work in claimed] == wanted  # in the order asked
        assert all(work.kind == mine and work.attempt == 0 for work in claimed)
        assert all(
            work.trigger == {"key": n} for work, n in zip(claimed, reversed(range(count)), strict=True)
        )
        assert all(work.checkpoints == {} and work.history == [] for work in claimed)
        rows = DeferredWork.objects.filter(pk__in=wanted)
        assert {(row.pk, row.status, row.claim_token) for row in rows} == {
            (work.id, Status.PROCESSING, work.claim_token) for work in claimed
        }
        assert all(row.claimed_at is not None and row.started_at is None for row in rows)
        assert claimer.claim_workflow_ids(wanted) == []  # already processing: never twice
        DeferredWork.objects.filter(pk__in=wanted).update(status=Status.PENDING, claim_token="")
    # Precompiled where the database has UPDATE … RETURNING (elsewhere the ORM's claim).
    precompiled = count == 1 and can_return_from_update("default")
    assert sorted(claimer._by_id) == ([1, 4] if precompiled else [])
    statuses = set(
        DeferredWork.objects.filter(pk__in=[later, foreign, task.pk]).values_list("status", flat=True)
    )
    assert statuses == {Status.PENDING}


def test_parse_new_work_reads_only_the_one_row_payload() -> None:
    assert parse_new_work("42 send-reminder") == (42, "send-reminder", None)
    assert parse_new_work("7 myapp.tasks.send") == (7, "myapp.tasks.send", None)  # before 0021
    assert parse_new_work("7 myapp.tasks.send emails") == (7, "myapp.tasks.send", "emails")
    assert parse_new_work("7 myapp.tasks.send two words") == (7, "myapp.tasks.send", "two words")
    for payload in ("", "probe:abc", "42", "x y", " 42 kind"):
        assert parse_new_work(payload) is None


def test_a_stopped_runner_leaves_no_session_of_its_async_prepares_open(register_workflow: Any) -> None:
    """Async prepares share one ORM thread (``sync_to_async``): its connections are closed
    when the runner stops, as the sync workers' are when their threads end."""

    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await DeferredWork.objects.filter(pk=0).aexists()  # the ORM, on the shared thread

    def shared_thread_connected() -> bool:
        return any(c.connection is not None for c in connections.all(initialized_only=True))

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": n} for n in range(3)])
    with override_settings(NEXUS_WORKFLOWS=FAST), running([kind], concurrency=1) as runner:
        wait_for(lambda: runner.stats.done == 3, timeout=30, what="all 3 done")
        assert asyncio.run(sync_to_async(shared_thread_connected, thread_sensitive=True)())
    assert not asyncio.run(sync_to_async(shared_thread_connected, thread_sensitive=True)())

"""``async def`` prepares that misbehave on the runner's event loop: saves at once, a save
given up by its caller (a timeout) while its write is queued, tasks left behind that fail
(or raise ``SystemExit``), and async ORM connections broken by an outage. In-process
runners on the real database."""

from __future__ import annotations

import asyncio
import logging
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections
from django.test import override_settings

from nexus_workflows import InvalidCheckpoint, enqueue_many
from nexus_workflows.models import DeferredWork, Status
from tests.processes import wait_for
from tests.raw_connections import raw_connection
from tests.test_runner_async import FAST, running

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "Maria Lopez +525512345678"


def test_saves_of_one_async_attempt_at_once_keep_every_patch(register_workflow: Any) -> None:
    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await asyncio.gather(save({"a": 1}), save({"b": 2}), save({"c": 3}))
        await save({"d": 4})

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    (work_id,) = enqueue_many(kind, [{"key": 1}])
    with override_settings(NEXUS_WORKFLOWS=FAST), running([kind]) as runner:
        wait_for(lambda: runner.stats.done == 1, timeout=20, what="the attempt done")
    # Each save wrote the whole journal: two at once each dropped the other's patch.
    assert DeferredWork.objects.get(pk=work_id).checkpoints == {"a": 1, "b": 2, "c": 3, "d": 4}


@contextmanager
def first_save_held() -> Iterator[Callable[[], None]]:
    """The first ``UPDATE`` of the work table that writes a journal (sets ``checkpoints``)
    waits, before it touches a row, until the returned function is called: a
    statement-level trigger that takes an advisory lock this test holds on a connection of
    its own. Only the first: a sequence, which no rollback takes back, counts them. (The
    values are not in the statement's text to tell one save from another: the app sends
    them apart from it, ``sql.postgresql.values_sent_apart``.)"""
    table = DeferredWork._meta.db_table
    holder = raw_connection()
    holder.execute("SELECT pg_advisory_lock(4242)")
    with connection.cursor() as cursor:
        cursor.execute("CREATE SEQUENCE nw_test_hold_once")
        cursor.execute(
            "CREATE FUNCTION nw_test_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            """IF current_query() ~ '[\\s,]"?checkpoints"?\\s*=' THEN """
            "IF nextval('nw_test_hold_once') = 1 THEN PERFORM pg_advisory_xact_lock_shared(4242); END IF; "
            "END IF; RETURN NULL; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER nw_test_hold BEFORE UPDATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION nw_test_hold()"
        )
    try:
        yield lambda: holder.execute("SELECT pg_advisory_unlock_all()")
    finally:
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER nw_test_hold ON {table}")
            cursor.execute("DROP FUNCTION nw_test_hold()")
            cursor.execute("DROP SEQUENCE nw_test_hold_once")


def held_statements() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 4242 AND NOT granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return cursor.fetchone()[0]


def happens_within(predicate: Callable[[], Any], seconds: float) -> bool:
    """Whether ``predicate`` comes true within ``seconds`` (for what must not happen)."""
    try:
        wait_for(predicate, timeout=seconds)
    except AssertionError:
        return False
    return True


@pytest.mark.postgresql
def test_a_save_given_up_by_its_caller_is_written_before_the_next_save(register_workflow: Any) -> None:
    """A save whose caller stops waiting (a timeout) is still written: the next save waits
    for it and keeps its patch. It used to be written after the next one, on another
    writer connection, overwriting that save's patch with an older journal."""
    marker = "held-by-the-test"
    timed_out, second_saved, finish = threading.Event(), threading.Event(), threading.Event()

    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        try:
            async with asyncio.timeout(0.2):
                await save({"first": marker})
        except TimeoutError:
            timed_out.set()
        await save({"second": 2})
        second_saved.set()
        while not finish.is_set():
            await asyncio.sleep(0.01)

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    (work_id,) = enqueue_many(kind, [{"key": 1}])

    def journal() -> dict[str, Any]:
        return DeferredWork.objects.get(pk=work_id).checkpoints

    with (
        first_save_held() as release,
        override_settings(NEXUS_WORKFLOWS=FAST),
        running([kind]) as runner,
    ):
        try:
            wait_for(held_statements, timeout=20, what="the first save's write held")
            # The timeout ends the caller's wait at once, the write still held.
            wait_for(timed_out.is_set, timeout=5, what="the first save given up")
            # Other writers are free: only the first save's write may hold the second back.
            second_early = happens_within(lambda: second_saved.is_set() or "second" in journal(), 1.0)
            release()
            wait_for(lambda: "first" in journal(), timeout=10, what="the first save written")
        finally:
            release()
            finish.set()
        wait_for(lambda: runner.stats.done == 1, timeout=20, what="the attempt done")
    assert journal() == {"first": marker, "second": 2}
    assert not second_early


@pytest.mark.postgresql
def test_an_attempt_ends_after_the_write_of_a_save_given_up(register_workflow: Any) -> None:
    """A prepare that gives up on a save and returns: its outcome is written after the
    save's write (it used to be written first, and the save then found the work done)."""
    marker = "held-by-the-test"
    timed_out = threading.Event()

    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        try:
            async with asyncio.timeout(0.2):
                await save({"first": marker})
        except TimeoutError:
            timed_out.set()

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    (work_id,) = enqueue_many(kind, [{"key": 1}])

    def status() -> str:
        return DeferredWork.objects.get(pk=work_id).status

    with (
        first_save_held() as release,
        override_settings(NEXUS_WORKFLOWS=FAST),
        running([kind]) as runner,
    ):
        try:
            wait_for(held_statements, timeout=20, what="the save's write held")
            wait_for(timed_out.is_set, timeout=5, what="the save given up")
            done_early = happens_within(lambda: status() == Status.DONE, 1.0)
        finally:
            release()
        wait_for(lambda: runner.stats.done == 1, timeout=20, what="the attempt done")
    assert DeferredWork.objects.get(pk=work_id).checkpoints == {"first": marker}
    assert not done_early


def test_a_refused_patch_leaves_the_next_save_free(register_workflow: Any) -> None:
    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        with pytest.raises(InvalidCheckpoint):
            await save({"when": object()})
        await save({"ok": 1})

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    (work_id,) = enqueue_many(kind, [{"key": 1}])
    with override_settings(NEXUS_WORKFLOWS=FAST), running([kind]) as runner:
        wait_for(lambda: runner.stats.done == 1, timeout=20, what="the attempt done")
    assert DeferredWork.objects.get(pk=work_id).checkpoints == {"ok": 1}


def test_a_failing_task_left_on_the_loop_is_logged_without_its_message(
    register_workflow: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        async def send() -> None:
            raise ValueError(f"no such patient: {SECRET}")

        asyncio.get_running_loop().create_task(send())  # never awaited, nor kept
        await asyncio.sleep(0.05)

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": 1}])
    caplog.set_level(logging.DEBUG)
    with override_settings(NEXUS_WORKFLOWS=FAST), running([kind]) as runner:
        wait_for(lambda: runner.stats.done == 1, timeout=20, what="the attempt done")
        wait_for(
            lambda: any("ValueError" in record.getMessage() for record in caplog.records),
            timeout=10,
            what="the task's error logged",
        )
    for record in caplog.records:
        text = record.getMessage()
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info))
        assert "Maria" not in text, record.name


@pytest.mark.parametrize("raised", [SystemExit, KeyboardInterrupt])
def test_a_task_left_on_the_loop_raising_system_exit_does_not_end_the_loop(
    register_workflow: Any, raised: type[BaseException]
) -> None:
    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        if trigger["key"] == 0:

            async def quit_() -> None:
                raise raised("stop")

            asyncio.get_running_loop().create_task(quit_())
            await asyncio.sleep(0.05)
        else:
            await asyncio.sleep(0.5)  # in flight when the task raises
        await save({"ok": True})

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": n} for n in range(3)])
    with override_settings(NEXUS_WORKFLOWS=FAST), running([kind]) as runner:
        # An ended loop left every attempt on it running forever, heart-beaten, held.
        wait_for(lambda: runner.stats.done == 3, timeout=20, what="every attempt done")
        enqueue_many(kind, [{"key": 3}])
        wait_for(lambda: runner.stats.done == 4, timeout=20, what="later work done too")


@pytest.mark.postgresql
def test_an_async_orm_connection_broken_by_an_outage_is_replaced(register_workflow: Any) -> None:
    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        await DeferredWork.objects.filter(pk=-1).aexists()  # the async ORM's thread
        await save({"queried": True})

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": 0}])
    with override_settings(NEXUS_WORKFLOWS=FAST), running([kind], async_concurrency=1) as runner:
        wait_for(lambda: runner.stats.done == 1, timeout=20, what="the first attempt done")
        # An outage: every session of the runner ends (the server restarted, say).
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        enqueue_many(kind, [{"key": n} for n in range(1, 4)])
        # The first to query may fail (released, not counted); the rest must succeed.
        # A connection left broken failed them all, then walked their schedules.
        wait_for(lambda: runner.stats.done == 4, timeout=30, what="the work after the outage done")
    # The async ORM's thread outlives the runner: close its connection (test teardown).
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())
    rows = DeferredWork.objects.filter(kind=kind)
    assert sorted(rows.values_list("status", "attempt")) == [(Status.DONE, 0)] * 4


@pytest.mark.parametrize("blocking", [True, False])
def test_an_async_prepare_that_blocks_the_loop_is_said_and_one_that_awaits_is_not(
    register_workflow: Any, caplog: pytest.LogCaptureFixture, blocking: bool
) -> None:
    """A sync call in an async def holds every other async attempt back; heartbeats go on
    in their own thread, so nothing went stale and nothing said so."""
    import time

    async def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        if blocking:
            time.sleep(2.5)  # what a sync HTTP client does inside an async def
        else:
            await asyncio.sleep(2.5)

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": 1}])
    caplog.set_level(logging.WARNING, logger="nexus_workflows")
    with override_settings(NEXUS_WORKFLOWS=FAST), running([kind]) as runner:
        wait_for(lambda: runner.stats.done == 1, timeout=20, what="the attempt done")
    said = [r.getMessage() for r in caplog.records if "event loop of async prepares" in r.getMessage()]
    if blocking:
        assert len(said) == 2, said  # once when late (after a second), once when back
        assert "has not run for" in said[0]
        assert "1 async attempt(s) in flight wait" in said[0]
        assert "runs again, after" in said[1]
    else:
        assert said == []


def test_a_runner_without_async_prepares_says_nothing_of_their_event_loop(
    register_workflow: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A runner of sync kinds only never starts the async prepares' loop: a loop that
    never runs is not one that an async prepare blocks (it said so, once, after a second)."""
    import time

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        time.sleep(2.0)  # beats go on meanwhile, a second and more

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": 1}])
    caplog.set_level(logging.WARNING, logger="nexus_workflows")
    with override_settings(NEXUS_WORKFLOWS=FAST), running([kind]) as runner:
        wait_for(lambda: runner.stats.done == 1, timeout=20, what="the attempt done")
    said = [r.getMessage() for r in caplog.records if "event loop of async prepares" in r.getMessage()]
    assert said == []

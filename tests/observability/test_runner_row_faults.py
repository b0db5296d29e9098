"""The runner's own row when its writes fail on PostgreSQL, where each write runs in a
transaction of its own (its lock wait bounded): a lock held on the row, a project's
trigger that refuses the row, at once or at commit. The failed write leaves its
transaction (rolled back) before anything else runs; the heartbeat keeps its session (a
refusal or a rolled-back error leaves it fine) and writes the row again once the fault
goes; a row is said written only once committed. Real runner, real lock, real trigger;
the sessions the heartbeat thread opens are counted by Django's own
``connection_created`` signal."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.test import override_settings

from nexus_workflows.deferred.runner import Runner
from nexus_workflows.observability.models import Runner as RunnerRow
from nexus_workflows.observability.observer import Observer
from tests.processes import wait_for
from tests.raw_connections import ended_when_idle, row_locked

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

# A sweep at every beat: it runs right after the row's write, where the old code went on
# in the transaction it had closed.
SETTINGS = {
    "POLL_INTERVAL": 0.05,
    "HEARTBEAT_INTERVAL": 0.1,
    "STALE_AFTER": 30,
    "SHUTDOWN_GRACE": 2,
    "SWEEP_INTERVAL": 0.01,
}
HEARTBEAT_THREAD = "nexus-workflows-heartbeat"
NOT_REFRESHED = "runner row not refreshed ("


class SessionCount:
    """New database sessions the runner's heartbeat thread opened."""

    def __init__(self) -> None:
        self.opened = 0

    def __call__(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == HEARTBEAT_THREAD:
            self.opened += 1


@pytest.fixture
def heartbeat_sessions() -> Iterator[SessionCount]:
    count = SessionCount()
    connection_created.connect(count, weak=False)
    yield count
    connection_created.disconnect(count)


@pytest.fixture
def runner_thread(register_workflow: Any) -> Iterator[Runner]:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    with override_settings(NEXUS_WORKFLOWS=SETTINGS):
        runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            yield runner
        finally:
            runner.request_stop()
            thread.join(30)
            connections.close_all()
    assert not thread.is_alive()


def failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if NOT_REFRESHED in r.getMessage()]


def refreshed_after(pk: int, seen: Any) -> bool:
    return RunnerRow.objects.filter(pk=pk, last_seen_at__gt=seen).exists()


def test_a_locked_runner_row_keeps_the_heartbeats_session(
    caplog: pytest.LogCaptureFixture, heartbeat_sessions: SessionCount, runner_thread: Runner
) -> None:
    """On the old code every refresh cut short by the lock (55P03, a refusal) closed the
    heartbeat's connection from inside its transaction: a new session at every beat while
    the lock lasted (here 1 per failed refresh)."""
    with caplog.at_level(logging.DEBUG, logger="nexus_workflows"):
        row = wait_for(lambda: RunnerRow.objects.first(), timeout=30, what="the runner's row")
        wait_for(lambda: heartbeat_sessions.opened >= 1, timeout=30, what="the heartbeat's session")
        before = heartbeat_sessions.opened
        with row_locked(RunnerRow, row.pk):
            wait_for(lambda: len(failures(caplog)) >= 4, timeout=30, what="four refreshes cut short")
            during = heartbeat_sessions.opened - before
        seen = RunnerRow.objects.get(pk=row.pk).last_seen_at
        wait_for(lambda: refreshed_after(row.pk, seen), timeout=30, what="the row refreshed again")
    assert during == 0, f"{during} new session(s) for {len(failures(caplog))} refreshes cut short"
    assert {message for message in failures(caplog)} == {f"{NOT_REFRESHED}OperationalError)"}


def test_a_refused_runner_row_is_written_again_without_a_closed_connection(
    caplog: pytest.LogCaptureFixture,
    heartbeat_sessions: SessionCount,
    runner_thread: Runner,
    runner_row_refused: Any,
) -> None:
    """The row is gone (purged while the runner was away) and a trigger refuses writing
    it again. On the old code the failed insert closed the connection inside the
    transaction and the sweep then ran on it: "runner row not refreshed (OperationalError)"
    (psycopg's "the connection is closed") at every beat, a new session at each, and no
    purge for ``SWEEP_INTERVAL``."""
    with caplog.at_level(logging.DEBUG, logger="nexus_workflows"):
        row = wait_for(lambda: RunnerRow.objects.first(), timeout=30, what="the runner's row")
        wait_for(lambda: heartbeat_sessions.opened >= 1, timeout=30, what="the heartbeat's session")
        before = heartbeat_sessions.opened
        runner_row_refused.install()
        RunnerRow.objects.filter(pk=row.pk).delete()
        wait_for(lambda: len(failures(caplog)) >= 4, timeout=30, what="four refused writes of the row")
        during = heartbeat_sessions.opened - before
        runner_row_refused.remove()
        again = wait_for(lambda: RunnerRow.objects.first(), timeout=30, what="the row written again")
    assert again.pk != row.pk
    assert during == 0, f"{during} new session(s) for {len(failures(caplog))} refused writes"
    assert {message for message in failures(caplog)} == {f"{NOT_REFRESHED}InternalError)"}
    assert "refused by the test" not in caplog.text  # the database's text: by type only


def test_a_runner_row_whose_commit_fails_is_not_said_to_be_written(
    caplog: pytest.LogCaptureFixture, runner_row_refused_at_commit: CommitRefusal
) -> None:
    """A deferred constraint trigger refuses the row at commit. In autocommit (the start)
    the insert itself fails; in the heartbeat's transaction the insert passes and the
    commit fails. On the old code the heartbeat said "this runner's row written after 1
    failed tries" before its commit, and kept the id of a row that never was."""
    observer = Observer(kinds=["test-outcomes"], concurrency=1, using="default", in_flight=lambda: 0)
    runner_row_refused_at_commit.install()
    with caplog.at_level(logging.DEBUG, logger="nexus_workflows"):
        observer.start()
        observer.heartbeat()
        refused = [r.getMessage() for r in caplog.records]
        runner_row_refused_at_commit.remove()
        observer.heartbeat()
    try:
        assert not [message for message in refused if "row written" in message], refused
        assert observer.runner_id == RunnerRow.objects.get().pk
        assert "could not write this runner's row again (InternalError)" in refused
        assert "this runner's row written after 2 failed tries" in caplog.text
    finally:
        observer.stop()


class CommitRefusal:
    """A real deferred constraint trigger that refuses every new runner row at commit."""

    installed = False

    def install(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE OR REPLACE FUNCTION nw_test_refuse_at_commit() RETURNS trigger LANGUAGE plpgsql "
                "AS $$ BEGIN RAISE EXCEPTION 'refused at commit by the test' USING ERRCODE = 'XX000'; END $$"
            )
            cursor.execute(
                "CREATE CONSTRAINT TRIGGER nw_test_refuse_at_commit AFTER INSERT ON "
                f"{RunnerRowRefusal.table()} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                "EXECUTE FUNCTION nw_test_refuse_at_commit()"
            )
        self.installed = True

    def remove(self) -> None:
        if self.installed:
            with connection.cursor() as cursor:
                table = RunnerRowRefusal.table()
                cursor.execute(f"DROP TRIGGER IF EXISTS nw_test_refuse_at_commit ON {table}")
                cursor.execute("DROP FUNCTION IF EXISTS nw_test_refuse_at_commit()")
            self.installed = False


@pytest.fixture
def runner_row_refused_at_commit() -> Iterator[CommitRefusal]:
    refusal = CommitRefusal()
    yield refusal
    refusal.remove()


class RunnerRowRefusal:
    """A real trigger that refuses every insert and update of the runner table."""

    installed = False

    def install(self) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE OR REPLACE FUNCTION nw_test_refuse_runner() RETURNS trigger LANGUAGE plpgsql AS $$ "
                "BEGIN RAISE EXCEPTION 'refused by the test' USING ERRCODE = 'XX000'; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER nw_test_refuse_runner BEFORE INSERT OR UPDATE ON {self.table()} "
                "FOR EACH ROW EXECUTE FUNCTION nw_test_refuse_runner()"
            )
        self.installed = True

    def remove(self) -> None:
        if self.installed:
            with connection.cursor() as cursor:
                cursor.execute(f"DROP TRIGGER IF EXISTS nw_test_refuse_runner ON {self.table()}")
                cursor.execute("DROP FUNCTION IF EXISTS nw_test_refuse_runner()")
            self.installed = False

    @staticmethod
    def table() -> str:
        return connection.ops.quote_name(RunnerRow._meta.db_table)


@pytest.fixture
def runner_row_refused() -> Iterator[RunnerRowRefusal]:
    refusal = RunnerRowRefusal()
    yield refusal
    refusal.remove()


def test_a_runner_row_on_a_session_the_server_ended_idle_is_refreshed_at_every_beat(
    caplog: pytest.LogCaptureFixture, register_workflow: Any
) -> None:
    """An operator's ``idle_session_timeout`` shorter than ``HEARTBEAT_INTERVAL`` ends the
    heartbeat's session between beats; with nothing held (no claims' beat renews it
    first) the row's refresh met it. On the old code it failed (at DEBUG) and closed the
    session, so only every other beat refreshed the row."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    with (
        ended_when_idle(HEARTBEAT_THREAD, "200ms") as opened,
        override_settings(NEXUS_WORKFLOWS={**SETTINGS, "HEARTBEAT_INTERVAL": 0.5}),
    ):
        runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        with caplog.at_level(logging.DEBUG, logger="nexus_workflows"):
            thread.start()
            try:
                # Each beat after the first finds its session ended, and opens another.
                wait_for(lambda: len(opened) >= 5, timeout=30, what="four sessions ended idle")
            finally:
                runner.request_stop()
                thread.join(30)
                connections.close_all()
    assert not thread.is_alive()
    assert failures(caplog) == []

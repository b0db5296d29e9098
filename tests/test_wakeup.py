"""Wake-ups: behind a real PgBouncer in transaction mode, lost ones are detected, reported
once and replaced by a short poll; a direct WAKEUP_DATABASE makes them work; a listener
that reconnects proves its connection again. And which inserts notify: only those made
while a runner waits (it holds the waiting lock), with no wake-up lost in between."""

from __future__ import annotations

import io
import socket
import statistics
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction

from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.deferred.wakeup import CHANNEL
from nexus_workflows.models import DeferredWork
from nexus_workflows.sql import postgresql
from tests.processes import ManagePy, database_url, wait_for
from tests.raw_connections import raw_connection
from tests.tcp_proxy import TcpProxy
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql, pytest.mark.slow]

# A poll interval far above every latency the tests accept: only a wake-up, or the short
# fallback poll, can start work in time.
SLOW_POLL = {"POLL_INTERVAL": 5, "HEARTBEAT_INTERVAL": 1, "STALE_AFTER": 10, "SHUTDOWN_GRACE": 1}
# The longest enqueue-to-start a wake-up (or the short fallback poll) may take: half the
# poll interval, room for a busy machine's slow commit or start-up, which a sample includes.
WOKEN_WITHIN = 2.5
LOST_WARNING = "wake-ups do not arrive"
SAMPLES = 5


def pooled_url(pgbouncer: Any) -> str:
    return pgbouncer.url(connection.settings_dict["NAME"])


def direct_url() -> str:
    return database_url(connections["direct"].settings_dict)


def start_runner(pgbouncer: Any, settings: dict[str, Any], *, direct: str | None = None) -> ManagePy:
    runner = ManagePy(
        "runworkflows",
        settings={**SLOW_POLL, **settings},
        database_url=pooled_url(pgbouncer),
        env={"DIRECT_DATABASE_URL": direct or direct_url()},
    )
    runner.wait_for_output("runner started")
    return runner


def status_line(runner: ManagePy) -> str | None:
    """The runner's line in ``manage.py workflows status``, if it has one."""
    out = io.StringIO()
    call_command("workflows", "status", stdout=out)
    name = f"{socket.gethostname()}:{runner.pid}"
    return next((line.strip() for line in out.getvalue().splitlines() if name in line), None)


def latencies_through_the_pooler(pgbouncer: Any, prefix: str) -> list[float]:
    """Enqueue SAMPLES items one by one through PgBouncer, as a web process behind it does
    (the runner idle at each arrival); seconds from each enqueue to its prepare."""
    keys = [f"{prefix}-{number}" for number in range(SAMPLES)]
    code = (
        "import time\nfrom nexus_workflows import enqueue\n"
        f"for key in {keys!r}:\n"
        "    time.sleep(0.5)\n"  # pacing, so that every item finds the runner idle
        "    enqueue('test-ledger', {'key': key})\n"
    )
    enqueuer = ManagePy("shell", "-c", code, database_url=pooled_url(pgbouncer))
    try:
        assert enqueuer.wait(60) == 0, enqueuer.output()
    finally:
        enqueuer.close()
    wait_for(
        lambda: Ledger.objects.filter(key__in=keys).count() == SAMPLES,
        timeout=30,
        what=f"{SAMPLES} items to run",
    )
    enqueued = dict(DeferredWork.objects.filter(dedupe_key__in=keys).values_list("dedupe_key", "created_at"))
    ran = dict(Ledger.objects.filter(key__in=keys).values_list("key", "created_at"))
    return [(ran[key] - enqueued[key]).total_seconds() for key in keys]


def test_lost_wakeups_behind_pgbouncer_are_reported_once_and_polled_short(pgbouncer: Any) -> None:
    runner = start_runner(pgbouncer, {"WAKEUP_FALLBACK_POLL_INTERVAL": 0.1})
    try:
        latencies = latencies_through_the_pooler(pgbouncer, "lost")
        line = wait_for(lambda: status_line(runner), timeout=10, what="the runner in status")
        assert " short-poll since " in line, line
        assert "set WAKEUP_DATABASE" in line, line
        assert runner.terminate() == 0
        output = runner.output()
        assert status_line(runner) is None  # a runner that stops removes its line
    finally:
        runner.close()
    assert output.count(LOST_WARNING) == 1, output
    assert "transaction mode" in output
    assert "NEXUS_WORKFLOWS['WAKEUP_DATABASE']" in output
    assert "polls every 0.1s (WAKEUP_FALLBACK_POLL_INTERVAL)" in output
    assert "wake-ups: short-poll" in output
    # POLL_INTERVAL is 5 s: only the short poll starts work this soon.
    assert max(latencies) < WOKEN_WITHIN, latencies


def test_a_runner_behind_pgbouncer_leaves_no_setting_on_the_sessions_it_shares() -> None:
    """In transaction mode PgBouncer hands one server session to one client after another
    and resets nothing. The runner's listener set its lock_timeout (1 s) on its session
    (before 2026-12-05): through a pooler the next client of that server session got it,
    so the runner's own claim waiting on a row lock failed as an outage after a second,
    and another application's queries could too. With one server session, every client
    shares the listener's."""
    import psycopg

    from tests.pgbouncer import PgBouncer

    direct = connections["direct"].settings_dict
    bouncer = PgBouncer(direct["HOST"] or "127.0.0.1", int(direct["PORT"] or 5432), pool_size=1)
    bouncer.start()
    runner = None
    try:
        runner = start_runner(bouncer, {"WAKEUP_FALLBACK_POLL_INTERVAL": 0.1})
        runner.wait_for_output(LOST_WARNING)  # the listener connected, listened and probed
        with psycopg.connect(pooled_url(bouncer), autocommit=True) as client:
            assert client.execute("SHOW lock_timeout").fetchone()[0] == "0"
        assert runner.terminate() == 0
    finally:
        if runner is not None:
            runner.close()
        bouncer.stop()


def test_a_direct_wakeup_database_makes_wakeups_work_behind_pgbouncer(pgbouncer: Any) -> None:
    runner = start_runner(pgbouncer, {"WAKEUP_DATABASE": "direct", "WAKEUP_FALLBACK_POLL_INTERVAL": 5})
    try:
        latencies = latencies_through_the_pooler(pgbouncer, "direct")
        line = wait_for(lambda: status_line(runner), timeout=10, what="the runner in status")
        assert " listening since " in line, line
        assert runner.terminate() == 0
        output = runner.output()
    finally:
        runner.close()
    assert LOST_WARNING not in output
    assert "wake-ups: listening" in output
    # Both poll intervals are 5 s: only a NOTIFY starts work this soon.
    assert max(latencies) < WOKEN_WITHIN, latencies
    assert statistics.median(latencies) < 0.5, latencies


def test_a_wakeup_database_that_is_not_the_runners_database_is_reported(pgbouncer: Any) -> None:
    # The listener's alias points at another database: its LISTEN hears nothing of ours.
    other = database_url({**connections["direct"].settings_dict, "NAME": "postgres"})
    runner = start_runner(
        pgbouncer, {"WAKEUP_DATABASE": "direct", "WAKEUP_FALLBACK_POLL_INTERVAL": 0.1}, direct=other
    )
    try:
        latencies = latencies_through_the_pooler(pgbouncer, "elsewhere")
        assert runner.terminate() == 0
        output = runner.output()
    finally:
        runner.close()
    assert output.count(LOST_WARNING) == 1, output
    assert "WAKEUP_DATABASE 'direct'" in output
    assert max(latencies) < WOKEN_WITHIN, latencies


def test_a_listener_that_reconnects_proves_its_wakeups_again(pgbouncer: Any) -> None:
    direct = connections["direct"].settings_dict
    proxy = TcpProxy(direct["HOST"] or "127.0.0.1", int(direct["PORT"] or 5432))
    proxy.start()
    through_proxy = database_url({**direct, "HOST": "127.0.0.1", "PORT": proxy.port})
    runner = start_runner(
        pgbouncer,
        {"WAKEUP_DATABASE": "direct", "WAKEUP_FALLBACK_POLL_INTERVAL": 0.1},
        direct=through_proxy,
    )
    try:
        assert "wake-ups: listening" in runner.output()
        proxy.cut()
        runner.wait_for_output("wake-up listener lost its connection")
        # Meanwhile the work goes on through the pooler, at the short poll.
        assert max(latencies_through_the_pooler(pgbouncer, "cut")) < WOKEN_WITHIN
        proxy.restore()
        runner.wait_for_output("wake-ups arrive again")
        latencies = latencies_through_the_pooler(pgbouncer, "restored")
        assert runner.terminate() == 0
        output = runner.output()
    finally:
        proxy.close()
        runner.close()
    assert LOST_WARNING not in output  # the probe after the reconnect arrived
    assert max(latencies) < WOKEN_WITHIN, latencies
    # Its connects failed every few seconds meanwhile: said once, not each time.
    assert output.count("wake-up listener cannot connect") == 1, output


# --- Which inserts notify (migration 0011): only while a runner waits for it -------------


def waiting_lock_holders() -> list[tuple[str, bool]]:
    """(mode, granted) of every other session holding or awaiting the waiting lock in the
    test database (runners' listeners hold it shared; an enqueue exclusively)."""
    classid, objid = postgresql.WAITING_LOCK
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.mode, l.granted FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s AND l.objsubid = 2 "
            "AND d.datname = current_database() AND l.pid <> pg_backend_pid() ORDER BY l.pid",
            [classid, objid],
        )
        return [(mode, granted) for mode, granted in cursor.fetchall()]


def first_notification(listener: Any, sender: Any) -> str:
    """Send a marker NOTIFY from ``sender`` and return the first payload ``listener`` gets:
    notifications arrive in commit order, so the marker comes first if and only if
    nothing committed before it notified."""
    sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
    return next(listener.notifies(timeout=5)).payload


@pytest.mark.postgresql
def test_an_insert_notifies_only_while_a_runner_waits_and_names_a_row_inserted_alone(
    register_workflow: Any,
) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    with raw_connection() as listener, raw_connection() as sender:
        postgresql.listen(listener, CHANNEL)
        enqueue_many(kind, [{"key": "nobody waits"}])
        assert first_notification(listener, sender) == "marker"

        postgresql.hold_waiting_lock(listener)  # as an idle runner's listener does
        (one,) = enqueue_many(kind, [{"key": 1}])
        enqueue_many(kind, [{"key": 2}, {"key": 3}])
        payloads = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
        assert payloads == [f"{one} {kind}", ""]
        # Dedupe conflicts, nothing inserted: no NOTIFY (migration 0012).
        enqueue_many(kind, [{"key": 1}])
        assert enqueue(kind, {"key": 1}) == one
        with transaction.atomic():
            assert enqueue(kind, {"key": 2}) is not None
        assert first_notification(listener, sender) == "marker"

        postgresql.release_waiting_lock(listener)  # as a runner with a backlog does
        enqueue_many(kind, [{"key": "busy"}])
        assert first_notification(listener, sender) == "marker"
    assert waiting_lock_holders() == []


@pytest.mark.postgresql
def test_an_enqueue_of_a_taken_key_leaves_the_waiting_lock_free(register_workflow: Any) -> None:
    """It inserted nothing, so nothing needs announcing: a runner may start waiting while
    the caller's transaction goes on (migration 0012)."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    taken = enqueue(kind, {"key": "taken"})
    with raw_connection() as listener:
        postgresql.listen(listener, CHANNEL)
        with transaction.atomic():
            assert enqueue(kind, {"key": "taken"}) == taken
            assert enqueue_many(kind, [{"key": "taken"}]) == [taken]
            postgresql.hold_waiting_lock(listener, lock_timeout=0.2)  # not held by this transaction
        assert waiting_lock_holders() == [("ShareLock", True)]


@pytest.mark.postgresql
def test_the_waiting_lock_waits_for_every_insert_that_sent_no_notify(register_workflow: Any) -> None:
    import psycopg

    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    with raw_connection() as listener:
        postgresql.listen(listener, CHANNEL)
        with transaction.atomic():
            enqueue_many(kind, [{"key": "open"}])  # no runner waits: no NOTIFY, lock taken
            # A runner cannot start waiting before this row is visible to its next claim.
            with pytest.raises(psycopg.errors.LockNotAvailable):
                postgresql.hold_waiting_lock(listener, lock_timeout=0.2)
        # Bounded for that statement only: the session keeps no lock_timeout of its own.
        assert listener.execute("SHOW lock_timeout").fetchone()[0] == "0"
        postgresql.hold_waiting_lock(listener, lock_timeout=0.2)  # committed: the lock is free
        assert waiting_lock_holders() == [("ShareLock", True)]


# Runner processes: POLL_INTERVAL and the fallback poll are both far above what the tests
# accept, so only a NOTIFY, or the claim a runner makes once it holds the lock, starts work.
NO_POLL = {
    "POLL_INTERVAL": 30,
    "WAKEUP_FALLBACK_POLL_INTERVAL": 30,
    "HEARTBEAT_INTERVAL": 1,
    "STALE_AFTER": 10,
    "SHUTDOWN_GRACE": 1,
}


def ran(key: str) -> bool:
    return Ledger.objects.filter(key=key).exists()


def test_an_idle_runner_waits_holding_the_lock_and_a_killed_one_leaves_none() -> None:
    runner = ManagePy("runworkflows", settings=NO_POLL)
    try:
        runner.wait_for_output("wake-ups: listening")
        wait_for(lambda: waiting_lock_holders() == [("ShareLock", True)], timeout=10, what="the lock held")
        started = time.monotonic()
        enqueue("test-ledger", {"key": "woken"})
        wait_for(lambda: ran("woken"), timeout=10, what="the woken item to run")
        assert time.monotonic() - started < 5  # a NOTIFY, not a poll (30 s)
        runner.kill()  # SIGKILL while waiting: its session ends, and the lock with it
        wait_for(lambda: waiting_lock_holders() == [], timeout=10, what="the lock released")
    finally:
        runner.close()
    with raw_connection() as listener, raw_connection() as sender:
        postgresql.listen(listener, CHANNEL)
        enqueue("test-ledger", {"key": "after the kill"})
        assert first_notification(listener, sender) == "marker"


def test_a_runner_with_a_backlog_lets_the_lock_go_and_waits_with_it_again() -> None:
    # One lane (sync kinds only): a runner lets the lock go only when every lane has a backlog.
    only_sync = ("--kind", "test-ledger")
    runner = ManagePy("runworkflows", *only_sync, settings={**NO_POLL, "CONCURRENCY": 1, "BATCH_SIZE": 1})
    try:
        runner.wait_for_output("wake-ups: listening")
        wait_for(lambda: waiting_lock_holders() == [("ShareLock", True)], timeout=10, what="the lock held")
        keys = [f"backlog-{number}" for number in range(8)]
        enqueue_many("test-ledger", [{"key": key, "sleep": 0.3} for key in keys])
        # Claims of one item at a time, each all it asked for: it claims again by itself.
        wait_for(lambda: waiting_lock_holders() == [], timeout=10, what="the lock let go")
        assert Ledger.objects.filter(key__in=keys).count() < len(keys)
        wait_for(
            lambda: Ledger.objects.filter(key__in=keys).count() == len(keys), timeout=30, what="the backlog"
        )
        wait_for(
            lambda: waiting_lock_holders() == [("ShareLock", True)], timeout=10, what="the lock held again"
        )
        enqueue("test-ledger", {"key": "after the backlog"})
        wait_for(lambda: ran("after the backlog"), timeout=5, what="a NOTIFY to wake it")
        assert runner.terminate() == 0
    finally:
        runner.close()


def test_a_runner_going_idle_finds_work_whose_insert_sent_no_notify() -> None:
    # The insert's transaction takes the lock while no runner waits, so it sends no NOTIFY;
    # the runner, idle meanwhile, cannot hold the lock until it commits, then claims.
    runner = None
    try:
        with transaction.atomic():
            enqueue("test-ledger", {"key": "unannounced"})
            runner = ManagePy("runworkflows", settings=NO_POLL)
            runner.wait_for_output("wake-ups: listening")
            wait_for(
                lambda: waiting_lock_holders() == [("ShareLock", False)],
                timeout=10,
                what="the runner's listener waiting for the lock",
            )
            assert not ran("unannounced")
        committed = time.monotonic()
        wait_for(lambda: ran("unannounced"), timeout=10, what="the unannounced item to run")
        assert time.monotonic() - committed < 5  # not the 30 s poll
        assert runner.terminate() == 0
    finally:
        if runner is not None:
            runner.close()

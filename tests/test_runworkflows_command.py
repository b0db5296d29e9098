"""``manage.py runworkflows``: in-process for its options, and as real processes for
crashes, shared work, shutdown and database outages."""

from __future__ import annotations

import io
import re
import signal
import threading
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from nexus_workflows import enqueue
from nexus_workflows.clock import database_now
from nexus_workflows.models import DeferredWork, Status
from tests.faults.servers import under_faketime
from tests.processes import ManagePy, overlapping, read_intervals, url_of_test_database, wait_for
from tests.raw_connections import raw_connection, updates_wait_for_a_lock
from tests.tcp_proxy import TcpProxy
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 2, "SHUTDOWN_GRACE": 1}
# Runners that share work and never die. A runner whose heartbeats lapse for STALE_AFTER
# counts as dead (README, "Heartbeats"), and an attempt it has in flight may then run again
# elsewhere; on a loaded 2-core machine a 2 s stall happened (3 items of 2,000 ran twice).
SHARING = {**FAST, "STALE_AFTER": 30}


class Upstream(Exception):
    pass


def test_once_prints_one_summary_line_and_exits(register_workflow: Any) -> None:
    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        if trigger["outcome"] == "retry":
            raise Upstream("try later")
        if trigger["outcome"] == "give up":
            raise Upstream("no more") from None

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    give_up = register_workflow(
        lambda t, c, s: (_ for _ in ()).throw(PermissionError("no")), retry_schedule=[1]
    )
    for number, outcome in enumerate(["done", "done", "retry"]):
        enqueue(kind, {"key": str(number), "outcome": outcome})
    abandoned = enqueue(give_up.kind, {"key": "x"})
    DeferredWork.objects.filter(pk=abandoned).update(attempt=1)  # schedule used up
    out = io.StringIO()
    call_command("runworkflows", "--once", "--kind", kind, "--kind", give_up.kind, stdout=out)
    assert out.getvalue().strip() == "runworkflows --once: 2 done, 1 rescheduled, 1 abandoned, 0 reclaimed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "must be a whole number of at least 1 and at most 1,024"),
        # Threads are started up front: "can't start new thread" before any work ran.
        (["--concurrency", "1000000000"], "--concurrency: must be a whole number of at least 1 and at most"),
        (["--concurrency", "1" * 5000], "must be a whole number of at least 1 and at most 1,024"),
        (["--poll-interval", "-1"], "must be a number of seconds greater than 0"),
        # An OverflowError of the runner's first idle wait.
        (["--poll-interval", "1e300"], "must be a number of seconds greater than 0 and at most 315,619,200"),
        (["--poll-interval", "nan"], "must be a number of seconds greater than 0 and at most 315,619,200"),
        (["--kind", "no-such-kind"], "no deferred workflow is registered for a kind given (a string of 12 "),
    ],
)
def test_bad_options_are_reported(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)) as raised:
        call_command("runworkflows", "--once", *args)
    echoed = args[1] if args[0] == "--kind" else repr(args[1])
    assert echoed not in str(raised.value)  # what was given is not echoed


def test_the_largest_options_are_taken(register_workflow: Any) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    enqueue(kind, {"key": "a"})
    out = io.StringIO()
    args = ["--kind", kind, "--concurrency", "1024", "--poll-interval", "315619200"]
    call_command("runworkflows", "--once", *args, stdout=out)
    assert "1 done" in out.getvalue()


def ledger_keys(kind: str) -> Counter[str]:
    return Counter(Ledger.objects.filter(kind=kind).values_list("key", flat=True))


def enqueue_ledger_items(count: int, **extra: Any) -> None:
    for number in range(count):
        enqueue("test-ledger", {"key": str(number), **extra})


def wait_for_status(work_id: str | None, status: Status, what: str, timeout: float = 30) -> None:
    wait_for(lambda: DeferredWork.objects.get(pk=work_id).status == status, timeout=timeout, what=what)


def unfinished() -> int:
    return DeferredWork.objects.filter(status__in=[Status.PENDING, Status.PROCESSING]).count()


def drain_with(runners: int, items: int, *, settings: dict[str, Any], timeout: float) -> list[ManagePy]:
    """Start ``runners`` runners, then enqueue ``items`` ledger items one by one while they
    wait for work, and wait until everything is done. Each item takes 10 ms, so that a
    runner claims only a few ahead of its threads and every runner gets some: no-op items,
    enqueued before the others were up, were all run by the first runner to poll."""
    processes = [ManagePy("runworkflows", settings=settings) for _ in range(runners)]
    try:
        # Every runner is up (its signal handlers installed) before any work arrives.
        for process in processes:
            process.wait_for_output("runner started")
        enqueue_ledger_items(items, sleep=0.01)
        wait_for(lambda: unfinished() == 0, timeout=timeout, interval=0.2, what=f"{items} items drained")
        for process in processes:
            assert process.terminate() == 0, process.output()
    finally:
        for process in processes:
            process.close()
    return processes


@pytest.mark.slow
def test_two_runners_share_the_work_without_running_anything_twice() -> None:
    runners = drain_with(2, 300, settings={**SHARING, "CONCURRENCY": 2}, timeout=120)
    keys = ledger_keys("test-ledger")
    assert len(keys) == 300
    assert set(keys.values()) == {1}
    assert DeferredWork.objects.filter(status=Status.DONE).count() == 300
    # Both took part: "never twice" was tested by two runners competing, not by one.
    assert set(Ledger.objects.values_list("pid", flat=True)) == {runner.pid for runner in runners}


@pytest.mark.slow
@pytest.mark.postgresql
def test_four_runners_drain_2000_items_each_exactly_once() -> None:
    runners = drain_with(4, 2000, settings=SHARING, timeout=240)
    keys = ledger_keys("test-ledger")
    assert len(keys) == 2000
    duplicates = {key: n for key, n in keys.items() if n != 1}
    assert duplicates == {}
    assert DeferredWork.objects.filter(status=Status.DONE).count() == 2000
    # All four took part (each item once among them).
    assert set(Ledger.objects.values_list("pid", flat=True)) == {runner.pid for runner in runners}


@pytest.mark.slow
def test_kill_9_mid_prepare_is_reclaimed_and_resumed_from_checkpoints(tmp_path: Path) -> None:
    hang_file = tmp_path / "hanging"
    work_id = enqueue("test-two-steps", {"key": "a", "hang_file": str(hang_file)})
    doomed = ManagePy("runworkflows", settings=FAST)
    rescuer = None
    try:
        wait_for(hang_file.exists, timeout=30, what="prepare to reach its hang")
        doomed.kill()
        assert DeferredWork.objects.get(pk=work_id).status == Status.PROCESSING
        rescuer = ManagePy("runworkflows", settings=FAST)
        wait_for_status(work_id, Status.DONE, "the work to be reclaimed and finished")
        assert rescuer.terminate() == 0
        output = rescuer.output()
    finally:
        doomed.close()
        if rescuer:
            rescuer.close()
    steps = Counter(Ledger.objects.filter(kind="test-two-steps").values_list("step", flat=True))
    assert steps == {"step-one": 1, "step-two": 1}  # step one was not repeated
    work = DeferredWork.objects.get(pk=work_id)
    assert work.attempt == 1
    assert work.checkpoints == {"step_one": True}
    assert [entry["outcome"] for entry in work.history] == ["lost"]
    assert f"test-two-steps #{work_id} attempt 2 of 4: reclaimed" in output


@pytest.mark.slow
def test_a_slow_prepare_with_a_live_runner_is_not_reclaimed(tmp_path: Path) -> None:
    started = tmp_path / "started"
    # The prepare outlasts STALE_AFTER twice over; heartbeats keep it. STALE_AFTER leaves
    # room for a stall of the first runner on a loaded machine (2 s seen: see SHARING).
    settings = {**FAST, "STALE_AFTER": 4, "HEARTBEAT_INTERVAL": 0.4}
    work_id = enqueue("test-slow", {"key": "a", "seconds": 9, "started_file": str(started)})
    first = ManagePy("runworkflows", settings=settings)
    second = None
    try:
        wait_for(started.exists, timeout=30, what="the slow prepare to start")
        second = ManagePy("runworkflows", settings=settings)
        second.wait_for_output("runner started")
        wait_for_status(work_id, Status.DONE, "the slow work to finish")
        assert first.terminate() == 0
        assert second.terminate() == 0
        second_output = second.output()
    finally:
        first.close()
        if second:
            second.close()
    assert Ledger.objects.filter(kind="test-slow").count() == 1
    work = DeferredWork.objects.get(pk=work_id)
    assert (work.attempt, work.history) == (0, [])
    assert "reclaimed from" not in second_output


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["test-slow", "test-blocking-async"])
def test_sigterm_keeps_the_claim_of_an_attempt_that_outlives_the_grace(tmp_path: Path, kind: str) -> None:
    """The process ends soon after the grace, its attempt with it: also an ``async def``
    attempt blocked in ``asyncio.to_thread``, whose thread Python's own exit would wait
    for while nothing refreshes the claim any more."""
    started = tmp_path / "started"
    work_id = enqueue(kind, {"key": "a", "seconds": 60, "started_file": str(started)})
    process = ManagePy("runworkflows", settings={**FAST, "SHUTDOWN_GRACE": 0.5})
    try:
        wait_for(started.exists, timeout=30, what="the slow prepare to start")
        claim = DeferredWork.objects.get(pk=work_id).claim_token
        began = time.monotonic()
        assert process.terminate(timeout=20) == 0
        assert time.monotonic() - began < 10
        output = process.output()
    finally:
        process.close()
    work = DeferredWork.objects.get(pk=work_id)
    # Not released: the attempt may have been running until the process ended. It goes
    # stale and is reclaimed (as a lost attempt) after STALE_AFTER.
    assert (work.status, work.attempt, work.claim_token) == (Status.PROCESSING, 0, claim)
    assert work.started_at is not None
    assert "exiting with 1 attempt(s) still running" in output
    assert "released" not in output
    assert Ledger.objects.count() == 0


@pytest.mark.slow
def test_sigterm_with_a_short_grace_never_lets_two_runners_execute_one_item_at_once(
    tmp_path: Path,
) -> None:
    """Two runners; the first gets SIGTERM while its attempts outlive the grace (and its
    process takes a while to exit, like one flushing an error reporter): the second runner
    starts those items only once the first cannot be running them any more."""
    ledger, finish = tmp_path / "ledger", tmp_path / "finish"
    settings = {**FAST, "SHUTDOWN_GRACE": 0.3, "CONCURRENCY": 2}
    trigger = {"ledger": str(ledger), "until_file": str(finish), "seconds": 60, "linger_at_exit": 0.5}
    ids = [enqueue("test-interval", {**trigger, "key": str(n)}) for n in range(2)]
    first = ManagePy("runworkflows", settings=settings)
    second = None
    try:
        first.wait_for_output("runner started")
        wait_for(lambda: len(read_intervals(ledger)) == 2, timeout=30, what="both attempts to start")
        second = ManagePy("runworkflows", settings=settings)
        second.wait_for_output("runner started")
        assert first.terminate(timeout=20) == 0
        finish.touch()  # from now on, every attempt ends at once
        for work_id in ids:
            wait_for_status(work_id, Status.DONE, "the item to be taken over and finished", timeout=60)
        assert second.terminate() == 0
    finally:
        first.close()
        if second:
            second.close()
    intervals = read_intervals(ledger)
    assert overlapping(intervals) == []
    assert {(i.key, i.pid) for i in intervals} == {(k, p) for k in "01" for p in (first.pid, second.pid)}
    assert all(i.ended for i in intervals if i.pid == second.pid)
    assert {DeferredWork.objects.get(pk=work_id).attempt for work_id in ids} == {1}  # started, lost


@pytest.mark.slow
def test_sigterm_lets_quick_attempts_finish(tmp_path: Path) -> None:
    started = tmp_path / "started"
    work_id = enqueue("test-slow", {"key": "a", "seconds": 0.8, "started_file": str(started)})
    process = ManagePy("runworkflows", settings={**FAST, "SHUTDOWN_GRACE": 10})
    try:
        wait_for(started.exists, timeout=30, what="the prepare to start")
        assert process.terminate(timeout=20) == 0
    finally:
        process.close()
    assert DeferredWork.objects.get(pk=work_id).status == Status.DONE
    assert Ledger.objects.filter(kind="test-slow").count() == 1


@pytest.mark.slow
@pytest.mark.postgresql
def test_runner_survives_the_database_going_away() -> None:
    settings = connection.settings_dict
    proxy = TcpProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    proxy.start()
    enqueue_ledger_items(400, sleep=0.01)
    process = ManagePy(
        "runworkflows",
        settings={**FAST, "STALE_AFTER": 60, "HEARTBEAT_INTERVAL": 1},
        database_url=url_of_test_database(port=proxy.port),
    )
    try:
        wait_for(lambda: Ledger.objects.count() >= 50, timeout=60, what="some work to be done")
        proxy.cut()
        time.sleep(3)
        assert process.process.poll() is None, process.output()
        proxy.restore()
        wait_for(lambda: unfinished() == 0, timeout=120, interval=0.2, what="the rest of the work")
        assert process.terminate() == 0
        output = process.output()
    finally:
        proxy.close()
        process.close()
    assert "database unavailable" in output
    assert "database reachable again" in output
    assert DeferredWork.objects.filter(status=Status.DONE).count() == 400
    assert set(ledger_keys("test-ledger")) == {str(n) for n in range(400)}  # no work lost


@pytest.mark.needs("server")
def test_a_runner_started_while_its_database_is_down_waits_for_it() -> None:
    """A runner started during an outage waits for its database, as one whose database goes
    away does. Django 6.1 runs the models' database checks at every command, and on MariaDB
    they connect (to read the server's version): a runner started while the server did not
    answer used to end there, with a traceback, before it could wait."""
    settings = connection.settings_dict
    default_port = {"postgresql": 5432, "mysql": 3306}[connection.vendor]
    proxy = TcpProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or default_port))
    # Not started yet: its port is held, not listening, so the runner's connections are refused.
    process = ManagePy("runworkflows", settings=FAST, database_url=url_of_test_database(port=proxy.port))
    try:
        wait_for(lambda: "database unavailable" in process.output(), timeout=60, what="the runner to wait")
        assert process.process.poll() is None, process.output()
        proxy.start()
        work_id = enqueue("test-ledger", {"key": "after-the-outage"})
        wait_for(
            lambda: DeferredWork.objects.get(pk=work_id).status == Status.DONE,
            timeout=60,
            what="the work done once the database answers",
        )
        assert process.terminate() == 0
    finally:
        proxy.close()
        process.close()
    assert ledger_keys("test-ledger") == Counter({"after-the-outage": 1})


@pytest.mark.slow
@pytest.mark.postgresql
def test_a_claim_that_waited_past_stale_after_starts_nothing_it_claimed(tmp_path: Path) -> None:
    """A claim's UPDATE stamps the heartbeat when it starts; one that then waits (a lock on
    the table, a commit held up by a synchronous standby) returns claims already stale. The
    runner started the item, and its own stale check in the same turn reclaimed it and
    started it again: two executions at once in one process. Now the claim counts from
    when its statement was sent, so that item is given up (forfeited) and runs once."""
    ledger, finish = tmp_path / "ledger", tmp_path / "finish"
    process = ManagePy("runworkflows", "--kind", "test-interval", settings=FAST)
    watcher = raw_connection()
    try:
        process.wait_for_output("runner started")
        trigger = {"key": "a", "ledger": str(ledger), "until_file": str(finish), "seconds": 60}
        work_id = enqueue("test-interval", trigger, delay=1)
        # Its claim's UPDATE waits for a lock (a trigger's; a lock on the row is skipped).
        with updates_wait_for_a_lock(DeferredWork, f"OLD.id = {int(work_id or 0)}"):
            wait_for(lambda: claims_waiting(watcher) == 1, timeout=10, what="the claim to wait for the lock")
            threading.Event().wait(FAST["STALE_AFTER"] + 1)  # the claim waits past STALE_AFTER
        wait_for(ledger.exists, timeout=10, what="the item to start")
        wait_for(lambda: "reclaimed from" in process.output(), timeout=10, what="the stale claim's reclaim")
        finish.touch()
        wait_for_status(work_id, Status.DONE, "the item to be done")
        assert process.terminate() == 0
        output = process.output()
    finally:
        watcher.close()
        process.close()
    # Lines "<pid> a start <time>": two of one pid before, the two executions at once.
    starts = [line for line in ledger.read_text().splitlines() if line.split()[2] == "start"]
    assert len(starts) == 1, starts
    assert "not starting 1 claimed item(s) (test-interval #" in output
    assert "claim lost" not in output
    work = DeferredWork.objects.get(pk=work_id)
    assert (work.attempt, work.lost_unstarted) == (0, 1)  # the forfeit cost no attempt


@pytest.mark.slow
@pytest.mark.postgresql
def test_an_attempt_that_ends_while_the_main_loop_waits_stays_heart_beaten(tmp_path: Path) -> None:
    """An outcome waits for the main loop to write it, held and heart-beaten. It was held
    only once the main loop took it in: an attempt that ended while the loop waited (here
    its claim, for a lock) went stale, and the runner's own stale check reclaimed it
    as a lost, started attempt and ran it again (attempt 2), its first result discarded."""
    ledger, finish = tmp_path / "ledger", tmp_path / "finish"
    process = ManagePy("runworkflows", "--kind", "test-interval", settings=FAST)
    watcher = raw_connection()
    try:
        process.wait_for_output("runner started")
        trigger = {"key": "a", "ledger": str(ledger), "until_file": str(finish), "seconds": 60}
        work_id = enqueue("test-interval", trigger)
        wait_for(ledger.exists, timeout=10, what="the attempt to start")
        blocker = enqueue("test-interval", {"key": "b", "ledger": str(ledger)}, delay=1)
        # Its claim's UPDATE waits for a lock (a trigger's; a lock on the row is skipped).
        with updates_wait_for_a_lock(DeferredWork, f"OLD.id = {int(blocker or 0)}"):
            wait_for(lambda: claims_waiting(watcher) == 1, timeout=10, what="the claim to wait for the lock")
            finish.touch()  # the attempt ends while the main loop waits
            wait_for(lambda: " a end " in ledger.read_text(), timeout=10, what="the attempt to end")
            threading.Event().wait(FAST["STALE_AFTER"] + 1)
        wait_for_status(work_id, Status.DONE, "the item to be done")
        wait_for_status(blocker, Status.DONE, "the other item to be done")
        assert process.terminate() == 0
        output = process.output()
    finally:
        watcher.close()
        process.close()
    assert ledger.read_text().count(" a start ") == 1
    assert "claim lost" not in output
    assert DeferredWork.objects.get(pk=work_id).attempt == 0


def claims_waiting(watcher: Any) -> int:
    """Claims (UPDATEs) of the test database waiting for a lock."""
    return watcher.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'"
    ).fetchone()[0]


@pytest.mark.slow
@pytest.mark.postgresql
def test_a_second_sigterm_during_an_outage_stops_the_runner_at_once(tmp_path: Path) -> None:
    """An outcome it cannot write is flushed until the grace ends, unless a second signal
    ends the grace: it stopped only when the whole SHUTDOWN_GRACE had passed (60 s here).
    The claim is kept, so the item is reclaimed once stale."""
    settings = connection.settings_dict
    proxy = TcpProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    proxy.start()
    ledger, finish = tmp_path / "ledger", tmp_path / "finish"
    trigger = {"key": "a", "ledger": str(ledger), "until_file": str(finish), "seconds": 60}
    work_id = enqueue("test-interval", trigger)
    process = ManagePy(
        "runworkflows",
        settings={**FAST, "STALE_AFTER": 60, "SHUTDOWN_GRACE": 60},
        database_url=url_of_test_database(port=proxy.port),
    )
    try:
        wait_for(lambda: read_intervals(ledger), timeout=30, what="the attempt to start")
        claim = DeferredWork.objects.get(pk=work_id).claim_token
        proxy.cut()
        finish.touch()  # the attempt ends during the outage: its outcome waits
        process.wait_for_output("database unavailable")
        process.send_sigterm()
        process.wait_for_output("SIGTERM: no new work is claimed")
        process.process.send_signal(signal.SIGTERM)
        process.wait_for_output("second SIGTERM: stopping now")
        began = time.monotonic()
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - began < 10
        output = process.output()
    finally:
        proxy.close()
        process.close()
    assert "exiting with 0 attempt(s) still running, 1 outcome(s) unwritten" in output
    work = DeferredWork.objects.get(pk=work_id)
    assert (work.status, work.claim_token) == (Status.PROCESSING, claim)


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.parametrize("offset", ["+10m", "-10m"], ids=["ten-minutes-ahead", "ten-minutes-behind"])
def test_runners_whose_clocks_disagree_still_run_each_item_exactly_once(offset: str, tmp_path: Path) -> None:
    """Claims, heartbeats, due checks and the stale cut-off are the database's clock: a
    runner whose host is ten minutes ahead does not see live work as stale, and one ten
    minutes behind does not make its own work look stale to the others."""
    ledger = tmp_path / "ledger"
    settings = {**FAST, "STALE_AFTER": 3, "CONCURRENCY": 2}
    runners = [
        ManagePy("runworkflows", settings=settings),
        ManagePy("runworkflows", settings=settings, **under_faketime(offset)),
    ]
    try:
        for process in runners:
            process.wait_for_output("runner started")
        for number in range(40):
            enqueue("test-interval", {"key": str(number), "ledger": str(ledger), "seconds": 0.3})
        wait_for(lambda: unfinished() == 0, timeout=90, interval=0.2, what="40 items drained")
        for process in runners:
            assert process.terminate() == 0, process.output()
        outputs = [process.output() for process in runners]
    finally:
        for process in runners:
            process.close()
    intervals = read_intervals(ledger)
    assert Counter(interval.key for interval in intervals) == {str(n): 1 for n in range(40)}
    assert all(interval.ended for interval in intervals)
    assert {interval.pid for interval in intervals} == {process.pid for process in runners}
    assert DeferredWork.objects.filter(status=Status.DONE, attempt=0).count() == 40
    assert not any("reclaimed from" in output for output in outputs)


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.parametrize("offset", ["+10m", "-10m"], ids=["ten-minutes-ahead", "ten-minutes-behind"])
@pytest.mark.parametrize("delay", [None, 60])
def test_new_work_is_due_by_the_databases_clock_whatever_the_enqueuing_hosts(
    offset: str, delay: int | None
) -> None:
    """A web host whose clock is ten minutes ahead must not make its new work wait ten
    minutes; one behind must not make delayed work due early."""
    delay_args = ["--delay", str(delay)] if delay else []
    process = ManagePy(
        "workflows", "enqueue", *delay_args, "test-ledger", '{"key": "skewed"}', **under_faketime(offset)
    )
    before = database_now("default")
    try:
        assert process.wait(60) == 0, process.output()
    finally:
        process.close()
    after = database_now("default")
    work = DeferredWork.objects.get(kind="test-ledger", dedupe_key="skewed")
    expected = timedelta(seconds=delay or 0)
    assert before + expected <= work.next_attempt_at <= after + expected
    assert before <= work.created_at <= after  # stamped by the database's clock too
    assert work.updated_at == work.created_at


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", "dead connections: dropped within 40s (TCP keepalives, tcp_user_timeout)"),
        ("?tcp_user_timeout=0", "dead connections: the database OPTIONS' TCP settings"),  # opted out
    ],
)
def test_runworkflows_says_in_its_start_line_how_it_notices_a_silent_network(
    query: str, expected: str
) -> None:
    process = ManagePy("runworkflows", "--once", database_url=url_of_test_database() + query)
    try:
        assert process.wait(60) == 0, process.output()
        start = [line for line in process.output().splitlines() if "runner started:" in line]
    finally:
        process.close()
    assert len(start) == 1
    assert expected in start[0]

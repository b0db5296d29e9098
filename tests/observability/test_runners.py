"""Live runners: each ``runworkflows`` process keeps a row, refreshed with its heartbeat,
removed at a clean shutdown, shown dead after ``kill -9`` and purged later."""

from __future__ import annotations

import re
import socket
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings
from django.utils import timezone

from nexus_workflows import __version__
from nexus_workflows.models import Runner
from nexus_workflows.observability import runners
from nexus_workflows.observability.clock import database_now
from tests.processes import ManagePy, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.3, "STALE_AFTER": 2, "SHUTDOWN_GRACE": 1}


def admin_client() -> Client:
    User.objects.create_superuser("root", "root@example.org", "pw")
    client = Client()
    client.login(username="root", password="pw")
    return client


@pytest.mark.slow
def test_a_runner_row_is_kept_fresh_and_removed_at_a_clean_shutdown() -> None:
    process = ManagePy("runworkflows", "--kind", "test-ledger", "--concurrency", "3", settings=FAST)
    try:
        process.wait_for_output("runner started")
        row = wait_for(lambda: Runner.objects.filter(pid=process.pid).first(), timeout=10, what="its row")
        assert (row.host, row.version, row.kinds, row.concurrency) == (
            socket.gethostname(),
            __version__,
            ["test-ledger"],
            3,
        )
        first_seen = row.last_seen_at
        wait_for(
            lambda: Runner.objects.get(pk=row.pk).last_seen_at > first_seen, timeout=10, what="a heartbeat"
        )
        assert runners.count_alive() == (1, 0)
        page = admin_client().get("/admin/nexus_workflows/runner/")
        assert page.status_code == 200
        assert f"pid {process.pid}" in page.content.decode()
        assert ">alive<" in page.content.decode()
        assert process.terminate() == 0, process.output()
    finally:
        process.close()
    assert not Runner.objects.filter(pk=row.pk).exists()


@pytest.mark.slow
def test_a_killed_runner_is_shown_dead_after_stale_after() -> None:
    process = ManagePy("runworkflows", settings=FAST)
    try:
        process.wait_for_output("runner started")
        row = wait_for(lambda: Runner.objects.filter(pid=process.pid).first(), timeout=10, what="its row")
        process.kill()  # SIGKILL: no shutdown, the row stays
    finally:
        process.close()
    assert Runner.objects.filter(pk=row.pk).exists()
    with override_settings(NEXUS_WORKFLOWS=FAST):
        wait_for(lambda: runners.count_alive() == (0, 1), timeout=10, what="the runner to be shown dead")
        client = admin_client()
        page = client.get("/admin/nexus_workflows/runner/").content.decode()
        assert f"pid {process.pid}" in page
        assert ">dead<" in page
        index = client.get("/admin/").content.decode()
    assert "<strong>0</strong> runners alive" in index
    assert "1 dead" in index


def test_dead_runners_are_purged_after_retention_and_live_ones_kept() -> None:
    live = runners.register(kinds=["a"], concurrency=1, using="default")
    gone = runners.register(kinds=["a"], concurrency=1, using="default")
    long_ago = timezone.now() - timedelta(days=2)
    Runner.objects.filter(pk=gone).update(last_seen_at=long_ago, started_at=long_ago)
    assert runners.purge_dead(database_now("default"), using="default") == 1
    assert list(Runner.objects.values_list("pk", flat=True)) == [live]


def test_a_dead_runners_in_flight_count_is_shown_as_what_it_ran_when_last_seen() -> None:
    """A dead runner runs nothing: its in-flight count is what it ran when last seen (live
    runners take those over), and must not read as work still running; a live one's is
    shown as it is."""
    live = runners.register(kinds=["a"], concurrency=4, using="default")
    gone = runners.register(kinds=["b"], concurrency=4, using="default")
    Runner.objects.filter(pk=live).update(in_flight=3)
    long_ago = timezone.now() - timedelta(hours=1)
    Runner.objects.filter(pk=gone).update(in_flight=2, last_seen_at=long_ago, started_at=long_ago)
    page = admin_client().get("/admin/nexus_workflows/runner/").content.decode()
    cells = dict(
        re.findall(
            r'<td class="field-kinds_column">(\w)</td>.*?<td class="field-in_flight_column">(.*?)</td>',
            page,
            re.S,
        )
    )
    assert cells["a"] == "3"
    assert re.fullmatch(r'<span class="nw-muted" title="[^"]*last seen[^"]*">— \(2\)</span>', cells["b"]), (
        cells
    )


def test_the_runner_admin_is_read_only(django_user_model: Any) -> None:
    pk = runners.register(kinds=["a"], concurrency=1, using="default")
    client = admin_client()
    assert client.get("/admin/nexus_workflows/runner/").status_code == 200
    assert client.get("/admin/nexus_workflows/runner/add/").status_code == 403
    assert client.post(f"/admin/nexus_workflows/runner/{pk}/delete/", {"post": "yes"}).status_code == 403
    assert Runner.objects.filter(pk=pk).exists()


@pytest.mark.slow
@pytest.mark.postgresql
def test_a_blocked_runner_row_does_not_stop_the_claims_heartbeats(tmp_path: Any) -> None:
    """The runner's row is bookkeeping: a lock on it (an operator's open transaction, a
    migration waiting for the table) must not hold back the heartbeats of the claims the
    runner is running, or another runner reclaims an attempt that is still running."""
    from nexus_workflows import enqueue
    from nexus_workflows.models import DeferredWork, Status
    from tests.processes import overlapping, read_intervals
    from tests.raw_connections import raw_connection

    ledger = tmp_path / "ledger"
    settings = {**FAST, "STALE_AFTER": 3, "HEARTBEAT_INTERVAL": 0.3}
    enqueue("test-interval", {"key": "long", "seconds": 9, "ledger": str(ledger)})
    first = ManagePy("runworkflows", "--kind", "test-interval", settings=settings)
    second = None
    locker = raw_connection()
    locker.autocommit = False  # the lock is held until rollback()
    try:
        first.wait_for_output("runner started")
        row = wait_for(lambda: Runner.objects.filter(pid=first.pid).first(), timeout=10, what="its row")
        wait_for(lambda: ledger.exists(), timeout=10, what="the attempt to start")
        # Hold the first runner's row, as an open transaction that touched it would.
        locker.execute("SELECT 1 FROM nexus_workflows_runner WHERE id = %s FOR UPDATE", [row.pk])
        second = ManagePy("runworkflows", "--kind", "test-interval", settings=settings)
        second.wait_for_output("runner started")
        wait_for(
            lambda: DeferredWork.objects.filter(status=Status.DONE).exists(), timeout=30, what="the work"
        )
    finally:
        locker.rollback()
        locker.close()
        first.close()
        if second is not None:
            second.close()
    assert overlapping(read_intervals(ledger)) == []
    assert DeferredWork.objects.get().attempt == 0  # never reclaimed: its runner was alive


@pytest.mark.slow
@pytest.mark.postgresql
def test_a_runner_whose_row_is_locked_still_stops_at_sigterm() -> None:
    """Removing the row at exit waits for a lock no longer than a refresh does: an open
    transaction on the row must not hang the runner's shutdown."""
    from tests.raw_connections import raw_connection

    runner = ManagePy("runworkflows", "--kind", "test-interval", settings=FAST)
    locker = raw_connection()
    locker.autocommit = False  # the lock is held until rollback()
    try:
        runner.wait_for_output("runner started")
        row = wait_for(lambda: Runner.objects.filter(pid=runner.pid).first(), timeout=10, what="its row")
        locker.execute("SELECT 1 FROM nexus_workflows_runner WHERE id = %s FOR UPDATE", [row.pk])
        assert runner.terminate(timeout=15) == 0  # before: waited for the lock for good
        warning = "could not remove this runner's row (OperationalError); it will show as dead"
        assert warning in runner.output()
    finally:
        locker.rollback()
        locker.close()
        runner.close()
    assert Runner.objects.filter(pk=row.pk).exists()  # left to show dead, then be purged


def test_the_runner_list_reads_the_databases_clock_in_its_own_query() -> None:
    """ "started" and "last seen" are judged by the database's clock, carried by the list's
    own query: no query a row (two a row after the clock moved to the database)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(3):
        runners.register(kinds=["a"], concurrency=1, using="default")
    clock_reads = ("SELECT statement_timestamp()", "SELECT UTC_TIMESTAMP(6)", "SELECT STRFTIME(")
    client = admin_client()
    with CaptureQueriesContext(connection) as queries:
        page = client.get("/admin/nexus_workflows/runner/")
    assert page.status_code == 200
    assert [q["sql"] for q in queries if q["sql"].startswith(clock_reads)] == []
    assert page.content.decode().count("just now") == 6  # started and last seen, three rows

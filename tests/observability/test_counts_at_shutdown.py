"""The dashboard's outcome counts of a runner stopped while the database is away (a
failover restarting the runners): its shutdown retries them like its outcomes, through
the grace; what it still cannot write is said, as a number, when it exits.

An in-process runner whose connections go through a TCP proxy the test cuts and restores;
the test reads through the "direct" alias, which the proxy does not stand in front of.
The counts are written at most every ``COUNTS_EVERY`` seconds: it is raised here so that
every count after the drain's first batch is still unwritten when the runner is stopped
(a real drain stopped within a second of its last batch). On SQLite, no server to cut: a
stop while another connection holds the file's write lock (a refusal, not an outage)."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.db.models import Sum
from django.test import override_settings

from nexus_workflows import enqueue_many
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.models import DeferredWork, OutcomeCount, Status
from nexus_workflows.observability import observer
from tests.processes import wait_for
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

ITEMS = 40
SETTINGS = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 60, "WAKEUP": False}
OUTAGE = "database unavailable"
NOT_WRITTEN = "could not write the last outcome counts"
PATIENT = "María Example"


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[TcpProxy]:
    """A proxy in front of the test database, which "default" (the runner's) goes through
    from now on; "direct" still connects straight."""
    settings = connections["default"].settings_dict
    tcp = TcpProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    tcp.start()
    connections["default"].close()
    # Every thread's connection of an alias is built from this one dict.
    monkeypatch.setitem(settings, "HOST", "127.0.0.1")
    monkeypatch.setitem(settings, "PORT", tcp.port)
    monkeypatch.setattr(observer, "COUNTS_EVERY", 3600.0)
    yield tcp
    tcp.close()
    connections["default"].close()  # opened through the proxy, if at all


def done_counted(kind: str, using: str = "direct") -> int:
    rows = OutcomeCount.objects.using(using).filter(kind=kind, outcome="done")
    return int(rows.aggregate(n=Sum("count"))["n"] or 0)


def said(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if text in record.getMessage()]


@contextlib.contextmanager
def drained_then_cut(
    register_workflow: Any, proxy: TcpProxy, caplog: pytest.LogCaptureFixture, grace: float
) -> Iterator[tuple[str, Runner, threading.Thread]]:
    """A runner that drained ITEMS quick items, asked to stop once the proxy was cut: the
    kind, the runner and its thread (stopping). Stopped at once and joined on the way out."""
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": f"visit-{number}", "patient": PATIENT} for number in range(ITEMS)])
    connections["default"].close()  # the test's own reads go through "direct"
    caplog.set_level(logging.INFO, logger="nexus_workflows")
    with override_settings(NEXUS_WORKFLOWS={**SETTINGS, "SHUTDOWN_GRACE": grace}):
        runner = Runner(kinds=[kind], concurrency=4, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            done = DeferredWork.objects.using("direct").filter(kind=kind, status=Status.DONE)
            wait_for(lambda: done.count() == ITEMS, timeout=60, what="the drain")
            # The hazard: the outcomes are all written, most of their counts are not yet.
            assert done_counted(kind) < ITEMS
            proxy.cut()
            runner.request_stop()
            yield kind, runner, thread
        finally:
            runner.request_stop(now=True)
            thread.join(30)
    assert not thread.is_alive()


# A database server behind a TCP proxy, and the "direct" alias: PostgreSQL's.
@pytest.mark.django_db(transaction=True, databases=["default", "direct"])
@pytest.mark.postgresql
def test_counts_held_at_a_stop_during_an_outage_are_written_once_it_ends_within_the_grace(
    register_workflow: Any, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """On the old code the shutdown wrote the outcomes only; the observer tried the counts
    once as it stopped, during the outage, and dropped them: the dashboard said a few done
    of the 40."""
    with drained_then_cut(register_workflow, proxy, caplog, grace=30) as (kind, runner, thread):
        # The shutdown met the outage (the old code's does not: it simply ends).
        wait_for(
            lambda: said(caplog, OUTAGE) or not thread.is_alive(), timeout=30, what="the outage at the stop"
        )
        proxy.restore()  # well within the grace
        thread.join(30)
    assert done_counted(kind) == ITEMS
    assert runner.stats.done == ITEMS
    assert not said(caplog, NOT_WRITTEN)


@pytest.mark.django_db(transaction=True, databases=["default", "direct"])
@pytest.mark.postgresql
def test_counts_still_unwritten_past_the_grace_are_said_by_number_and_nothing_else(
    register_workflow: Any, proxy: TcpProxy, caplog: pytest.LogCaptureFixture
) -> None:
    with drained_then_cut(register_workflow, proxy, caplog, grace=1) as (kind, _runner, thread):
        written = done_counted(kind)
        thread.join(30)  # the grace, and min(grace, 5) s of flushing: about a second
    assert done_counted(kind) == written  # nothing arrived after all
    (warning,) = said(caplog, NOT_WRITTEN)
    assert warning.levelno == logging.WARNING
    message = warning.getMessage()
    assert message.startswith(f"{NOT_WRITTEN} (")
    assert message.endswith(f"): the dashboard misses up to {ITEMS - written} outcome(s)"), message
    for record in caplog.records:  # kinds, outcomes and numbers: never an item's data
        assert "María" not in record.getMessage()
        assert "visit-" not in record.getMessage()


@pytest.mark.sqlite
@pytest.mark.django_db(transaction=True)
def test_counts_sqlite_kept_busy_at_the_stop_are_said_too(
    register_workflow: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A refusal (SQLite busy; a lock wait cut short elsewhere) is no error the counts'
    write raises: it keeps them for the next try. On the old code those it still kept at
    the exit were dropped without a word."""
    monkeypatch.setattr(observer, "COUNTS_EVERY", 3600.0)
    # The runner's connections wait 0.1 s for the file's write lock (the project's: 30 s).
    monkeypatch.setitem(connection.settings_dict.setdefault("OPTIONS", {}), "timeout", 0.1)
    connections.close_all()
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": f"visit-{number}", "patient": PATIENT} for number in range(ITEMS)])
    caplog.set_level(logging.INFO, logger="nexus_workflows")
    holder = sqlite3.connect(connection.settings_dict["NAME"], timeout=5, isolation_level=None)
    with override_settings(NEXUS_WORKFLOWS={**SETTINGS, "SHUTDOWN_GRACE": 1}):
        runner = Runner(kinds=[kind], concurrency=4, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            done = DeferredWork.objects.filter(kind=kind, status=Status.DONE)
            wait_for(lambda: done.count() == ITEMS, timeout=60, what="the drain")
            written = done_counted(kind, "default")
            holder.execute("BEGIN IMMEDIATE")  # the file's write lock, for the whole stop
            runner.request_stop()
            thread.join(30)
        finally:
            runner.request_stop(now=True)
            thread.join(30)
            if holder.in_transaction:
                holder.execute("ROLLBACK")
            holder.close()
    assert not thread.is_alive()
    assert written < ITEMS
    assert done_counted(kind, "default") == written
    expected = f"{NOT_WRITTEN} (refused): the dashboard misses up to {ITEMS - written} outcome(s)"
    assert [(r.levelno, r.getMessage()) for r in said(caplog, NOT_WRITTEN)] == [(logging.WARNING, expected)]

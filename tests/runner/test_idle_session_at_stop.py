"""A runner stopped after its loop waited longer than the server lets a session sit idle
(PostgreSQL's ``idle_session_timeout``, set by an operator): the server has ended the
loop's session, and the stop's first statement meets that. It is renewed quietly, as a
turn renews it: no WARNING of an outage, and nothing of the stop is lost (the last outcome
counts are written, the runner's row is removed). Before, the stop logged "database
unavailable" (counts to write) or "could not remove this runner's row" (none to write:
the dashboard then showed a dead runner), and with no grace left its release of unstarted
claims gave up on it (they stayed processing until ``STALE_AFTER``). Real sessions, ended
by the server."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from django.db import connection, connections
from django.db.models import Sum
from django.db.models.functions import Now
from django.test import override_settings

from nexus_workflows import enqueue
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.deferred.runner.shutdown import release_claims
from nexus_workflows.models import DeferredWork, FlowWindowSlot, Status
from nexus_workflows.observability import observer
from nexus_workflows.observability.models import OutcomeCount
from nexus_workflows.observability.models import Runner as RunnerRow
from tests.processes import wait_for
from tests.raw_connections import ended_when_idle, live_pids, raw_connection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

#: The loop turns only when told (polls an hour apart): its session sits idle until the stop.
SETTINGS = {
    "POLL_INTERVAL": 3600,
    "HEARTBEAT_INTERVAL": 0.5,
    "STALE_AFTER": 30,
    "SHUTDOWN_GRACE": 2,
    "WAKEUP": False,
}
LOOP = "test-runner"  # the name of the thread the runner's loop runs on


@pytest.fixture
def loop_sessions() -> Iterator[list[int]]:
    """Backend pids of the sessions the runner's loop opens, each of which the server ends
    once it sits idle for 300 ms; the other threads' sessions are left as they are."""
    with ended_when_idle(LOOP, "300ms") as opened:
        yield opened


@pytest.mark.parametrize(
    "counts_every",
    [
        pytest.param(float("inf"), id="counts-left-for-the-stop"),  # the stop's flush writes them
        pytest.param(0.0, id="counts-written-already"),  # the row's removal is the first statement
    ],
)
def test_a_stop_on_a_session_the_server_ended_while_idle_says_nothing_and_loses_nothing(
    loop_sessions: list[int],
    counts_every: float,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(observer, "COUNTS_EVERY", counts_every)
    pk = enqueue("test-noop", {"key": "1"})
    connections.close_all()
    with override_settings(NEXUS_WORKFLOWS=SETTINGS):
        runner = Runner(kinds=["test-noop"], concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name=LOOP)
        thread.start()
        try:
            wait_for(
                lambda: DeferredWork.objects.get(pk=pk).status == Status.DONE,
                timeout=30,
                what="the item done",
            )
            wait_for(lambda: RunnerRow.objects.exists(), timeout=10, what="the runner's row")
            # Every session the loop opened was ended by the server for sitting idle.
            wait_for(
                lambda: loop_sessions and not set(loop_sessions) & live_pids(), timeout=30, what="idle end"
            )
            caplog.clear()
            ended = len(loop_sessions)
        finally:
            runner.request_stop()
            thread.join(30)
    assert not thread.is_alive()
    assert runner.stats.done == 1
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert warnings == []
    assert len(loop_sessions) > ended  # the stop met the ended session, and opened a new one
    assert not RunnerRow.objects.exists()  # not left to show as a dead runner
    written = OutcomeCount.objects.filter(kind="test-noop", outcome="done").aggregate(n=Sum("count"))["n"]
    assert written == 1


@pytest.mark.parametrize("kind", ["test-noop", "test-flow-rate"])
def test_unstarted_claims_are_released_on_a_new_session_even_with_no_grace_left(kind: str) -> None:
    """A second signal (or ``SHUTDOWN_GRACE`` 0) leaves no time for a retry after an outage,
    but a session the server ended while idle is none: renewed at once, the claims go back
    (pending, due now), not left processing until ``STALE_AFTER``. A rate-limited kind's
    claim gives its reserved start back first: that statement meets the ended session."""
    pk = enqueue(kind, {"key": "1"})
    (work,) = Claimer(kinds=[kind], using="default").claim_due(1)
    assert (work.reservation is not None) == (kind == "test-flow-rate")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
        cursor.execute("SET idle_session_timeout = '300ms'")
    with raw_connection() as other:
        gone = "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s"
        wait_for(lambda: other.execute(gone, [pid]).fetchone()[0], timeout=30, what="the session ended idle")
    outages: list[BaseException] = []

    released = release_claims(
        [work], lambda: True, using="default", on_outage=outages.append, pause=lambda _: None
    )

    assert (released, outages) == (1, [])
    row = DeferredWork.objects.get(pk=pk)
    assert (row.status, row.attempt) == (Status.PENDING, 0)
    # No start of the window is held ahead for an attempt that will not start.
    assert not FlowWindowSlot.objects.filter(started_at__gt=Now()).exists()

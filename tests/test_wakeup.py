"""Wake-ups behind a real PgBouncer in transaction mode: lost ones are detected, reported
once and replaced by a short poll; a direct WAKEUP_DATABASE makes them work; a listener
that reconnects proves its connection again."""

from __future__ import annotations

import io
import socket
import statistics
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections

from nexus_workflows import enqueue_many
from nexus_workflows.deferred.wakeup import CHANNEL
from nexus_workflows.models import DeferredWork
from tests.processes import ManagePy, database_url, wait_for
from tests.tcp_proxy import TcpProxy
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql, pytest.mark.slow]

# A poll interval far above every latency the tests accept: only a wake-up, or the short
# fallback poll, can start work in time.
SLOW_POLL = {"POLL_INTERVAL": 5, "HEARTBEAT_INTERVAL": 1, "STALE_AFTER": 10, "SHUTDOWN_GRACE": 1}
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
    assert max(latencies) < 1.0, latencies


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
    assert max(latencies) < 1.0, latencies
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
    assert max(latencies) < 1.0, latencies


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
        assert max(latencies_through_the_pooler(pgbouncer, "cut")) < 1.0
        proxy.restore()
        runner.wait_for_output("wake-ups arrive again")
        latencies = latencies_through_the_pooler(pgbouncer, "restored")
        assert runner.terminate() == 0
        output = runner.output()
    finally:
        proxy.cut()
        runner.close()
    assert LOST_WARNING not in output  # the probe after the reconnect arrived
    assert max(latencies) < 1.0, latencies


# The NOTIFY of an INSERT names a row inserted alone (issue 12: the runner claims it by id).
@pytest.mark.postgresql
def test_the_notify_of_one_inserted_row_names_it_and_of_many_names_none(register_workflow: Any) -> None:
    import psycopg

    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    params = dict(connection.get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        (one,) = enqueue_many(kind, [{"key": 1}])
        enqueue_many(kind, [{"key": 2}, {"key": 3}])
        enqueue_many(kind, [{"key": 1}])  # a dedupe conflict: nothing inserted
        payloads = [n.payload for n in listener.notifies(timeout=2, stop_after=3)]
    assert payloads == [f"{one} {kind}", "", ""]

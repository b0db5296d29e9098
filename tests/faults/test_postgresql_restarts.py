"""Fault suite: a private PostgreSQL cluster restarted (``-m fast`` and ``-m immediate``)
during a 3,000-item drain by two runner processes. Nothing is lost, nothing runs to the
end twice, no attempt is consumed by the outages, and both runners stay up."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.servers import PrivatePostgres
from tests.processes import ManagePy, read_intervals, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

ITEMS = 3000
# (items done when the restart starts, pg_ctl restart mode)
RESTARTS = [(600, "fast"), (1400, "immediate"), (2200, "immediate")]
RUNNER_SETTINGS = {
    "POLL_INTERVAL": 0.2,
    "HEARTBEAT_INTERVAL": 1,
    "STALE_AFTER": 10,
    "SHUTDOWN_GRACE": 5,
    "CONCURRENCY": 4,
    # The async variant runs as many at once: the same drain, as long, as many kills.
    "ASYNC_CONCURRENCY": 4,
}


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


def query(url: str, sql: str) -> list[tuple[Any, ...]] | None:
    """Rows of ``sql`` on a fresh connection, or ``None`` while the server is away."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2) as connection:
            return connection.execute(sql).fetchall()
    except psycopg.Error:
        return None


def run_to_end(*args: str, url: str, timeout: float = 180) -> None:
    process = ManagePy(*args, database_url=url)
    try:
        assert process.wait(timeout) == 0, process.output()
    finally:
        process.close()


ENQUEUE = """
from nexus_workflows import enqueue_many
triggers = [{{"key": str(n), "ledger": {ledger!r}, "steps": 1, "step_seconds": 0.01}} for n in range({items})]
for start in range(0, len(triggers), 500):
    enqueue_many({kind!r}, triggers[start:start + 500])
"""


# The same drain with sync prepares (worker threads) and async ones (the runner's loop).
@pytest.mark.parametrize("kind", ["test-interval", "test-interval-async"])
def test_postgresql_restarts_during_a_drain_consume_no_attempts(
    private_postgres: PrivatePostgres, tmp_path: Path, report_figures: Callable[[str], None], kind: str
) -> None:
    private_postgres.create_database("nw_faults_drain")
    url = private_postgres.url("nw_faults_drain")
    ledger = tmp_path / "ledger"
    run_to_end("migrate", "--no-input", "-v", "0", url=url)
    run_to_end("shell", "-c", ENQUEUE.format(ledger=str(ledger), items=ITEMS, kind=kind), url=url)
    table = "nexus_workflows_deferredwork"

    def done() -> int:
        rows = query(url, f"SELECT count(*) FROM {table} WHERE status = 'done'")
        return rows[0][0] if rows else -1

    runners = [ManagePy("runworkflows", settings=RUNNER_SETTINGS, database_url=url) for _ in range(2)]
    outages: list[tuple[str, int, float]] = []
    try:
        for runner in runners:
            runner.wait_for_output("runner started", timeout=60)
        began = time.monotonic()
        for threshold, mode in RESTARTS:
            wait_for(lambda t=threshold: done() >= t, timeout=120, interval=0.05, what=f"{threshold} done")
            at = done()
            outages.append((mode, at, private_postgres.restart(mode)))
        wait_for(lambda: done() == ITEMS, timeout=240, interval=0.2, what=f"all {ITEMS} items done")
        drained = time.monotonic() - began
        alive = [runner.process.poll() is None for runner in runners]
        exit_codes = [runner.terminate(timeout=30) for runner in runners]
        outputs = [runner.output() for runner in runners]
    finally:
        for runner in runners:
            runner.close()

    statuses = dict(query(url, f"SELECT status, count(*) FROM {table} GROUP BY status") or [])
    attempts = dict(query(url, f"SELECT attempt, count(*) FROM {table} GROUP BY attempt") or [])
    histories = [
        json.loads(h) if isinstance(h, str) else h
        for (h,) in query(url, f"SELECT history FROM {table}") or []
    ]
    released = sum(
        1 for history in histories for entry in history if entry.get("reason") == "database unavailable"
    )
    lost = sum(1 for history in histories for entry in history if entry.get("outcome") == "lost")
    intervals = read_intervals(ledger)
    ends = Counter(interval.key for interval in intervals if interval.ended)
    starts = Counter(interval.key for interval in intervals)
    restarted = sum(1 for n in starts.values() if n > 1)
    restarted = sum(1 for n in starts.values() if n > 1)
    unavailable_logs = sum(output.count("database unavailable (") for output in outputs)

    report_figures(
        f"PostgreSQL restarts ({kind}): {ITEMS} items drained by 2 runners in {drained:.1f}s; "
        + "; ".join(f"restart -m {mode} at {at} done, server away {away:.2f}s" for mode, at, away in outages)
        + f"; statuses {statuses}; attempts {attempts}; attempts released for the outage {released}; "
        f"claims lost and reclaimed {lost}; items started more than once {restarted}; "
        f"'database unavailable' log lines {unavailable_logs}; runners alive {alive}"
    )
    assert alive == [True, True]
    assert exit_codes == [0, 0], outputs
    assert statuses == {"done": ITEMS}  # 0 lost, 0 abandoned
    assert attempts == {0: ITEMS}  # the outages consumed no attempt
    assert set(ends) == {str(n) for n in range(ITEMS)}
    assert [key for key, count in ends.items() if count > 1] == []  # 0 done twice
    assert unavailable_logs >= 1  # the runners did see the outages

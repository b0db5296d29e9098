"""Fault suite: a private PostgreSQL cluster restarted (``-m fast`` and ``-m immediate``)
during a 3,000-item drain by two runner processes. Nothing is lost, nothing runs to the
end twice, no attempt is consumed by the outages, and both runners stay up."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.drains import TABLE, drain_through_restarts, query, run_to_end
from tests.faults.servers import PrivatePostgres
from tests.processes import read_intervals

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
    drain = drain_through_restarts(
        private_postgres,
        url,
        items=ITEMS,
        restarts=RESTARTS,
        runner_args=["runworkflows"],
        settings=RUNNER_SETTINGS,
    )
    histories = [
        json.loads(h) if isinstance(h, str) else h
        for (h,) in query(url, f"SELECT history FROM {TABLE}") or []
    ]
    released = sum(
        1 for history in histories for entry in history if entry.get("reason") == "database unavailable"
    )
    lost = sum(1 for history in histories for entry in history if entry.get("outcome") == "lost")
    intervals = read_intervals(ledger)
    ends = Counter(interval.key for interval in intervals if interval.ended)
    starts = Counter(interval.key for interval in intervals)
    restarted = sum(1 for n in starts.values() if n > 1)
    unavailable_logs = sum(output.count("database unavailable (") for output in drain.outputs)

    report_figures(
        f"PostgreSQL restarts ({kind}): {ITEMS} items drained by 2 runners in {drain.seconds:.1f}s; "
        f"{drain.describe_outages()}; statuses {drain.statuses}; attempts {drain.attempts}; "
        f"attempts released for the outage {released}; claims lost and reclaimed {lost}; "
        f"items started more than once {restarted}; "
        f"'database unavailable' log lines {unavailable_logs}; runners alive {drain.alive}"
    )
    assert drain.alive == [True, True]
    assert drain.exit_codes == [0, 0], drain.outputs
    assert drain.statuses == {"done": ITEMS}  # 0 lost, 0 abandoned
    assert drain.attempts == {0: ITEMS}  # the outages consumed no attempt
    assert set(ends) == {str(n) for n in range(ITEMS)}
    assert [key for key, count in ends.items() if count > 1] == []  # 0 done twice
    assert unavailable_logs >= 1  # the runners did see the outages

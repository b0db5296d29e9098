"""Fault suite: a runner's connections go silent for good while new ones work: a failover
that moves a virtual IP or a DNS name (RDS Multi-AZ, keepalived), a NAT table that lost
its state. Packets of the old connections are dropped without a word (no RST), so
without TCP keepalives and a user timeout a statement waits for the kernel's
retransmission limit (``tcp_retries2``: about 15 minutes here) and an idle connection
for ever.

The cluster runs in a network namespace of the test's own (tests/faults/partitions.py)
behind a virtual IP routed through one of two paths. The runner connects to the virtual
IP, directly or through a private PgBouncer; mid-drain the path goes silent and the
virtual IP moves to the other path. The runner must notice within the bound its TCP
settings give (``runworkflows``: dead_connections.py; PgBouncer: its own), reconnect,
and finish the drain with no attempt consumed, nothing run twice and nothing overlapping.

``RECOVERY`` bounds each wait at 45 s: the expected recovery takes a few seconds (the
bound is 3 s per dead connection at STALE_AFTER 20 s), and before the fix the runner
was still stuck after it."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import IN_CI
from tests.faults.drains import TABLE, done_count, ids_logged, midway_in, outage_seconds, query, run_to_end
from tests.faults.partitions import Partitions
from tests.faults.servers import PrivatePostgres
from tests.pgbouncer import PgBouncer
from tests.processes import ManagePy, overlapping, read_intervals, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

DATABASE = "nw_faults_vip"
ITEMS = 40
RECOVERY = 45.0
# STALE_AFTER 20 s: dead connections dropped within 2 s + 1 s (tcp_user_timeout a tenth of
# it, keepalive probes every second), so the runner keeps its claims with a wide margin.
SETTINGS = {
    "POLL_INTERVAL": 0.2,
    "HEARTBEAT_INTERVAL": 1,
    "STALE_AFTER": 20,
    "SHUTDOWN_GRACE": 5,
    "CONCURRENCY": 4,
    "ASYNC_CONCURRENCY": 4,
}
# PgBouncer watching its own server connections the same way (the runner's TCP settings
# see only the loopback to PgBouncer, which acknowledges everything itself).
PGBOUNCER_TCP = {
    "tcp_keepalive": 1,
    "tcp_keepidle": 1,
    "tcp_keepintvl": 1,
    "tcp_keepcnt": 3,
    "tcp_user_timeout": 2000,
}
ENQUEUE = """
from nexus_workflows import enqueue_many
enqueue_many({kind!r}, [
    {{"key": str(n), "ledger": {ledger!r}, "seconds": 0.2, "steps": 2, "step_seconds": 0.2}}
    for n in range({items})
])
"""


@pytest.fixture
def bouncer(partitions: Partitions, partitioned_postgres: PrivatePostgres) -> Iterator[PgBouncer]:
    """A private PgBouncer in transaction mode (in the host's namespace) in front of the
    virtual IP, with TCP keepalives and a user timeout on its sockets."""
    if not PgBouncer.available():
        message = "Debian's pgbouncer is not installed (bin/test installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    with PgBouncer(partitions.virtual_ip, partitioned_postgres.port, settings=PGBOUNCER_TCP) as started:
        yield started


@dataclass
class FailoverDrain:
    """What a drain through a silent failover showed."""

    done_at_cut: int = 0
    stalled_for: float = 0.0  # seconds from the cut until the next item was done
    drained_in: float = 0.0  # seconds from the cut until every item was done
    alive: bool = False
    exit_code: int | None = None
    output: str = ""
    statuses: dict[str, int] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    history: Counter[tuple[str, str]] = field(default_factory=Counter)

    def figures(self) -> str:
        return (
            f"{self.done_at_cut} of {ITEMS} done at the cut, the next {self.stalled_for:.1f}s later, "
            f"all {self.drained_in:.1f}s later; "
            f"outages the runner logged {outage_seconds(self.output)} s; "
            f"'heartbeat failed' {self.output.count('heartbeat failed')}; statuses {self.statuses}; "
            f"attempts {self.attempts}; history {dict(self.history)}"
        )


def drain_through_failover(
    server: PrivatePostgres, partitions: Partitions, runner_url: str, kind: str, ledger: Path
) -> FailoverDrain:
    """Drain ITEMS two-step items with one runner on ``runner_url``; once it is midway
    through some, silence the virtual IP's path for good and move the virtual IP to the
    other one."""
    observer = server.url(DATABASE, host=partitions.paths[1].inner_address)  # never cut
    run_to_end("migrate", "--no-input", "-v", "0", url=observer)
    run_to_end("shell", "-c", ENQUEUE.format(kind=kind, ledger=str(ledger), items=ITEMS), url=observer)
    drain = FailoverDrain()
    runner = ManagePy("runworkflows", "--kind", kind, settings=SETTINGS, database_url=runner_url)
    try:
        runner.wait_for_output("runner started", timeout=60)
        wait_for(lambda: midway_in(ledger, runner.pid), timeout=30, interval=0.02, what="the runner midway")
        partitions.blackhole(0)
        partitions.move_virtual_ip(1)
        cut_at = time.monotonic()
        drain.done_at_cut = done_count(observer)
        wait_for(
            lambda: done_count(observer) > drain.done_at_cut,
            timeout=RECOVERY,
            interval=0.05,
            what=f"an item done after the failover; the runner's log ends:\n{runner.output()[-3000:]}",
        )
        drain.stalled_for = time.monotonic() - cut_at
        wait_for(
            lambda: done_count(observer) == ITEMS,
            timeout=RECOVERY,
            interval=0.2,
            what=f"all {ITEMS} done after the failover; the runner's log ends:\n{runner.output()[-3000:]}",
        )
        drain.drained_in = time.monotonic() - cut_at
        drain.alive = runner.process.poll() is None
        drain.exit_code = runner.terminate()
        drain.output = runner.output()
    finally:
        runner.close()
    drain.statuses = dict(query(observer, f"SELECT status, count(*) FROM {TABLE} GROUP BY status") or [])
    drain.attempts = dict(query(observer, f"SELECT attempt, count(*) FROM {TABLE} GROUP BY attempt") or [])
    for (history,) in query(observer, f"SELECT history FROM {TABLE}") or []:
        entries = json.loads(history) if isinstance(history, str) else history
        drain.history.update((entry.get("outcome"), entry.get("reason")) for entry in entries)
    return drain


def assert_drained_once(drain: FailoverDrain, ledger: Path, kind: str) -> None:
    output = drain.output
    intervals = read_intervals(ledger)
    ends = Counter(interval.key for interval in intervals if interval.ended)
    steps = Counter((interval.key, step) for interval in intervals for step in interval.steps)
    assert drain.alive, output
    assert drain.exit_code == 0, output
    assert output.count("runner started") == 1, output
    assert drain.statuses == {"done": ITEMS}, output
    # Its claims never went stale: it reconnected well within STALE_AFTER.
    assert drain.attempts == {0: ITEMS}, output
    # Only attempts released for the outage, if any (their saves failed on a dead connection).
    assert set(drain.history) <= {("released", "database unavailable")}, drain.history
    assert set(ends) == {str(n) for n in range(ITEMS)}
    assert [key for key, count in ends.items() if count > 1] == []  # none ran to the end twice
    assert [key for key, count in steps.items() if count > 1] == []  # no saved step ran again
    assert overlapping(intervals) == []  # no two executions of one item at once
    assert set(ids_logged(output, kind, "done").values()) == {1}
    assert "claim lost" not in output, output
    assert "Traceback" not in output, output


# A sync prepare (its saves on journal writers, from worker threads) and an async one.
@pytest.mark.parametrize("kind", ["test-interval", "test-interval-async"])
def test_a_runner_notices_its_connections_went_silent_and_reconnects(
    partitions: Partitions,
    partitioned_postgres: PrivatePostgres,
    tmp_path: Path,
    report_figures: Callable[[str], None],
    kind: str,
) -> None:
    partitioned_postgres.create_database(DATABASE)
    ledger = tmp_path / "ledger"
    url = partitioned_postgres.url(DATABASE)  # the virtual IP
    drain = drain_through_failover(partitioned_postgres, partitions, url, kind, ledger)
    report_figures(f"silent failover, direct ({kind}): {drain.figures()}")
    assert "dead connections: dropped within 3s" in drain.output, drain.output
    assert_drained_once(drain, ledger, kind)
    assert "database unavailable (" in drain.output, drain.output  # its statements met the silence


def test_behind_pgbouncer_its_own_tcp_settings_notice_silent_server_connections(
    partitions: Partitions,
    partitioned_postgres: PrivatePostgres,
    bouncer: PgBouncer,
    tmp_path: Path,
    report_figures: Callable[[str], None],
) -> None:
    partitioned_postgres.create_database(DATABASE)
    ledger = tmp_path / "ledger"
    drain = drain_through_failover(
        partitioned_postgres, partitions, bouncer.url(DATABASE), "test-interval", ledger
    )
    log = bouncer.log().splitlines()
    # PgBouncer dropped its silent server connections and failed their clients' statements;
    # the runner's reconnects, through it, got server connections by the new path.
    crashed = [line for line in log if " S-" in line and "server conn crashed?" in line]
    report_figures(
        f"silent failover behind PgBouncer (its tcp_user_timeout 2000 ms, keepalives 1/1/3): "
        f"{drain.figures()}; server connections PgBouncer dropped {len(crashed)}"
    )
    assert_drained_once(drain, ledger, "test-interval")
    assert crashed, log

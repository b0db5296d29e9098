"""Fault suite: a silent network partition between one runner and PostgreSQL that heals.

Two runners drain journalled three-step items from a private cluster in a network
namespace (tests/faults/partitions.py), runner A by one path, runner B by another. A's
path is blackholed (every packet either way dropped: no RST, no ICMP) for longer than
STALE_AFTER, so B reclaims what A held; then it heals. A must not have run a journalled
step of an item B took over (the save before it fails, so the step never starts), no two
executions of one item overlap, every item is done once with no saved step run twice, and
A, still running, works again by itself."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults.drains import TABLE, done_count, ids_logged, midway_in, outage_seconds, query, run_to_end
from tests.faults.partitions import Partitions
from tests.faults.servers import PrivatePostgres
from tests.processes import ManagePy, overlapping, read_intervals, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

DATABASE = "nw_faults_partition"
KIND = "test-interval"
FIRST, SECOND = 40, 8  # items before the partition, and after it heals
SETTINGS = {
    "POLL_INTERVAL": 0.2,
    "HEARTBEAT_INTERVAL": 1,
    "STALE_AFTER": 10,
    "SHUTDOWN_GRACE": 5,
    "CONCURRENCY": 4,
}
ENQUEUE = """
from nexus_workflows import enqueue_many
enqueue_many({kind!r}, [
    {{"key": str(n), "ledger": {ledger!r}, "seconds": 0.3, "steps": 3, "step_seconds": 0.2}}
    for n in range({first}, {last})
])
"""


def enqueue(url: str, ledger: Path, first: int, last: int) -> None:
    run_to_end("shell", "-c", ENQUEUE.format(kind=KIND, ledger=str(ledger), first=first, last=last), url=url)


def test_a_partition_longer_than_stale_after_hands_the_work_over_and_the_runner_recovers(
    partitions: Partitions,
    partitioned_postgres: PrivatePostgres,
    tmp_path: Path,
    report_figures: Callable[[str], None],
) -> None:
    server = partitioned_postgres
    server.create_database(DATABASE)
    path_a, path_b = (server.url(DATABASE, host=path.inner_address) for path in partitions.paths)
    ledger = tmp_path / "ledger"
    run_to_end("migrate", "--no-input", "-v", "0", url=path_b)
    enqueue(path_b, ledger, 0, FIRST)
    runner_a = ManagePy("runworkflows", "--kind", KIND, settings=SETTINGS, database_url=path_a)
    runner_b = ManagePy("runworkflows", "--kind", KIND, settings=SETTINGS, database_url=path_b)
    try:
        runner_a.wait_for_output("runner started", timeout=60)
        runner_b.wait_for_output("runner started", timeout=60)
        # A is inside attempts: some of their steps saved, not all.
        held = wait_for(lambda: midway_in(ledger, runner_a.pid), timeout=30, interval=0.02, what="A midway")
        partitions.blackhole(0)
        cut_at = (query(path_b, "SELECT now()") or [(None,)])[0][0]
        held |= midway_in(ledger, runner_a.pid)
        # B alone finishes everything: A's work too, once A's heartbeats are STALE_AFTER old.
        wait_for(lambda: done_count(path_b) == FIRST, timeout=60, interval=0.2, what="B to finish")
        partitions.heal(0)
        # Then A alone: B stops, new work arrives.
        assert runner_b.terminate() == 0, runner_b.output()
        enqueue(path_b, ledger, FIRST, FIRST + SECOND)
        wait_for(
            lambda: done_count(path_b) == FIRST + SECOND, timeout=60, interval=0.2, what="A to do the new"
        )
        # Sessions the server still keeps of A's connections from before the cut: A's kernel
        # dropped them while the path was silent, and no FIN or RST reached the server.
        lingering = query(
            path_b,
            "SELECT count(*) FROM pg_stat_activity WHERE client_addr = "
            f"'{partitions.paths[0].host_address}' AND backend_start < '{cut_at}'",
        )
        a_alive = runner_a.process.poll() is None
        assert runner_a.terminate() == 0, runner_a.output()
        output_a, output_b = runner_a.output(), runner_b.output()
    finally:
        runner_a.close()
        runner_b.close()

    rows = query(path_b, f"SELECT id, dedupe_key, status, attempt FROM {TABLE}") or []
    key_of = {row[0]: row[1] for row in rows}
    intervals = read_intervals(ledger)
    steps = Counter((interval.key, step) for interval in intervals for step in interval.steps)
    done = ids_logged(output_a, KIND, "done") + ids_logged(output_b, KIND, "done")
    lost_by_a = {key_of[work_id] for work_id in ids_logged(output_a, KIND, "claim lost")}
    taken_over = {key for key in held if any(i.key == key and i.pid == runner_b.pid for i in intervals)}
    second_by = Counter(interval.pid for interval in intervals if int(interval.key) >= FIRST)
    report_figures(
        f"partition that heals: A running {len(held)} of {FIRST} items (a step saved) when its path "
        f"went silent; B took them over: {len(taken_over)}; A logged 'claim lost' for {len(lost_by_a)}; "
        f"attempts {dict(Counter(row[3] for row in rows))}; A's outages {outage_seconds(output_a)} s, "
        f"'heartbeat failed' {output_a.count('heartbeat failed')}; items whose body ran to the end "
        f"twice {sum(1 for n in Counter(i.key for i in intervals if i.ended).values() if n > 1)}; "
        f"server sessions still kept of A's connections from before the cut "
        f"{lingering[0][0] if lingering else None}"
    )
    assert a_alive, output_a
    assert output_a.count("runner started") == 1
    assert len(rows) == FIRST + SECOND
    assert {row[2] for row in rows} == {"done"}
    assert done == Counter(dict.fromkeys(key_of, 1)), (output_a, output_b)  # each done once, by one runner
    assert [key for key, count in steps.items() if count > 1] == []  # no saved step ran twice
    assert overlapping(intervals) == []  # no two executions of one item at once
    assert taken_over, "B took over none of A's attempts: the partition tested nothing"
    # What A was running when cut off and B then ran, A gave up once it could tell.
    assert taken_over <= lost_by_a, output_a
    assert second_by == Counter({runner_a.pid: SECOND}), second_by  # A works again, alone
    assert "Traceback" not in output_a + output_b

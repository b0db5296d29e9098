"""Fault suite: 20 ``kill -9``\\s of runner processes during a 500-item, three-step drain
by two runners, each runner restarted after it is killed. Nothing is lost, no journalled
step runs twice, no two executions of one item overlap, and nothing is abandoned unless
its prepare started as many times as its schedule allows."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from nexus_workflows import enqueue_many
from nexus_workflows.deferred.registry import registry
from nexus_workflows.models import DeferredWork, Status
from tests.processes import ManagePy, overlapping, read_intervals, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

ITEMS = 500
KILLS = 20
STEPS = 3
RUNNER_SETTINGS = {
    "POLL_INTERVAL": 0.1,
    "HEARTBEAT_INTERVAL": 0.5,
    "STALE_AFTER": 4,  # a live runner stalled by the restarts around it keeps its claims
    "SHUTDOWN_GRACE": 1,
    "CONCURRENCY": 4,
    # The async variant runs as many at once: the same drain, as long, as many kills.
    "ASYNC_CONCURRENCY": 4,
}


def unfinished() -> int:
    return DeferredWork.objects.filter(status__in=[Status.PENDING, Status.PROCESSING]).count()


# The same drain with sync prepares (worker threads) and async ones (the runner's loop).
@pytest.mark.parametrize("kind", ["test-interval", "test-interval-async"])
def test_twenty_kill_9s_during_a_three_step_drain_lose_nothing(
    tmp_path: Path, report_figures: Callable[[str], None], kind: str
) -> None:
    ledger = tmp_path / "ledger"
    trigger = {"ledger": str(ledger), "steps": STEPS, "step_seconds": 0.1}
    enqueue_many(kind, [{**trigger, "key": str(n)} for n in range(ITEMS)])
    chance = random.Random(20)
    slots = [ManagePy("runworkflows", settings=RUNNER_SETTINGS) for _ in range(2)]
    killed: list[ManagePy] = []
    kills_at: list[int] = []
    began = time.monotonic()
    try:
        for kill in range(KILLS):
            victim = slots[kill % 2]
            victim.wait_for_output("runner started", timeout=60)
            time.sleep(chance.uniform(0.2, 0.8))  # a random moment of its work
            remaining = unfinished()
            assert remaining > 0, f"the work ran out after {kill} kills"
            kills_at.append(remaining)
            victim.kill()  # SIGKILL: no release, no outcome written, no heartbeat
            killed.append(victim)
            slots[kill % 2] = ManagePy("runworkflows", settings=RUNNER_SETTINGS)
        wait_for(lambda: unfinished() == 0, timeout=300, interval=0.2, what="the drain to end")
        drained = time.monotonic() - began
        alive = [slot.process.poll() is None for slot in slots]
        exit_codes = [slot.terminate(timeout=30) for slot in slots]
    finally:
        for process in [*killed, *slots]:
            process.close()

    max_attempts = registry.get(kind).max_attempts
    rows = list(DeferredWork.objects.values("dedupe_key", "status", "attempt", "lost_unstarted", "history"))
    statuses = Counter(row["status"] for row in rows)
    intervals = read_intervals(ledger)
    starts = Counter(interval.key for interval in intervals)
    steps = Counter((interval.key, step) for interval in intervals for step in interval.steps)
    ends = Counter(interval.key for interval in intervals if interval.ended)
    abandoned = [row for row in rows if row["status"] == Status.ABANDONED]
    lost_entries = Counter(
        entry.get("started") for row in rows for entry in row["history"] if entry.get("outcome") == "lost"
    )
    report_figures(
        f"kill -9 loop ({kind}): {KILLS} kills of 2 runners during a {ITEMS}-item, {STEPS}-step "
        f"drain, {drained:.1f}s; unfinished items at each kill {kills_at}; statuses {dict(statuses)}; "
        f"attempts {dict(Counter(row['attempt'] for row in rows))}; lost attempts in history: "
        f"{lost_entries.get(True, 0)} started, {lost_entries.get(False, 0)} before starting; "
        f"items started more than once {sum(1 for n in starts.values() if n > 1)}; items whose prepare "
        f"ran to its end twice (killed before the outcome was written) "
        f"{sum(1 for n in ends.values() if n > 1)}; runners alive {alive}"
    )
    assert len(kills_at) == KILLS
    assert alive == [True, True]
    assert exit_codes == [0, 0]
    assert len(rows) == ITEMS
    assert set(statuses) <= {Status.DONE, Status.ABANDONED}  # 0 lost
    # Nothing abandoned unless its prepare started as often as the schedule allows.
    assert [row["dedupe_key"] for row in abandoned if starts[row["dedupe_key"]] < max_attempts] == []
    # 0 done twice: every journalled step of every done item ran exactly once...
    done_keys = {row["dedupe_key"] for row in rows if row["status"] == Status.DONE}
    assert {key for key, _ in steps} >= done_keys
    assert [(key, step) for (key, step), count in steps.items() if count > 1] == []
    # ...and no two executions of one item ever overlapped.
    assert overlapping(intervals) == []
    # Every lost attempt is in its item's history, with whether it had started.
    assert all(
        {"attempt", "started"} <= set(entry)
        for row in rows
        for entry in row["history"]
        if entry.get("outcome") == "lost"
    )

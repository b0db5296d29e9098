"""Fault suite with flow limits on (issue 19, item 3): PostgreSQL restarts, kill -9 and a
runner whose clock is ten minutes off. The kind ``test-flow-faults`` has every limit at
once (``concurrency=2``, a ``serial_key``, ``rate_limit=(10, 1)``); every limit is
checked from the start and end stamps the attempts wrote themselves (tests/flow/ledger.py).
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.models import DeferredWork, FlowWindowSlot, Status
from tests.faults.drains import drain_through_restarts, run_to_end
from tests.faults.servers import PrivatePostgres, under_faketime
from tests.flow.ledger import Span, max_overlap, most_starts_in_window, read_spans
from tests.processes import ManagePy, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

KIND = "test-flow-faults"
CONCURRENCY, RATE, PERIOD = 2, 10, 1.0


def check_limits(spans: list[Span]) -> None:
    """Every limit of ``test-flow-faults``, from the attempts' own stamps."""
    assert max_overlap(spans) <= CONCURRENCY
    starts = sorted((span.started, span.pid, span.key) for span in spans)
    closest = min(
        (later[0] - first[0], first, later) for first, later in zip(starts, starts[RATE:], strict=False)
    )
    assert most_starts_in_window(spans, PERIOD) <= RATE, f"{RATE + 1} starts within {closest}"
    by_key: dict[str, list[Span]] = {}
    for span in spans:
        by_key.setdefault(span.group, []).append(span)
    for group, key_spans in by_key.items():
        assert max_overlap(key_spans) == 1, group  # one at a time per serial key
        order = [int(span.key) for span in sorted(key_spans, key=lambda s: s.started) if span.key.isdigit()]
        assert order == sorted(order), group  # earliest enqueued first


# --- PostgreSQL restarts ------------------------------------------------------------------

ITEMS = 120
KEYS = 30
RESTARTS = [(25, "fast"), (55, "immediate"), (85, "immediate")]
RESTART_SETTINGS = {
    "POLL_INTERVAL": 0.2,
    "HEARTBEAT_INTERVAL": 1,
    "STALE_AFTER": 10,
    "SHUTDOWN_GRACE": 5,
    "CONCURRENCY": 4,
}
ENQUEUE = """
from nexus_workflows import enqueue_many
enqueue_many({kind!r}, [
    {{"key": n, "to": f"p{{n % {keys}}}", "sleep": 0.05, "ledger": {ledger!r}}} for n in range({items})
])
"""


def test_postgresql_restarts_keep_every_limit_and_consume_no_attempt(
    private_postgres: PrivatePostgres, tmp_path: Path, report_figures: Callable[[str], None]
) -> None:
    private_postgres.create_database("nw_faults_flow")
    url = private_postgres.url("nw_faults_flow")
    ledger = tmp_path / "ledger"
    run_to_end("migrate", "--no-input", "-v", "0", url=url)
    run_to_end("shell", "-c", ENQUEUE.format(kind=KIND, keys=KEYS, ledger=str(ledger), items=ITEMS), url=url)
    drain = drain_through_restarts(
        private_postgres,
        url,
        items=ITEMS,
        restarts=RESTARTS,
        runner_args=["runworkflows", "--kind", KIND],
        settings=RESTART_SETTINGS,
    )
    spans = read_spans(ledger)
    runs = Counter(span.key for span in spans)
    report_figures(
        f"PostgreSQL restarts with limits on: {ITEMS} items of concurrency={CONCURRENCY}, "
        f"{KEYS} serial keys, rate ({RATE}, {PERIOD:g}) drained by 2 runners in {drain.seconds:.1f}s; "
        f"{drain.describe_outages()}; statuses {drain.statuses}; attempts {drain.attempts}; "
        f"most running at once {max_overlap(spans)}; most starts in any {PERIOD:g}s "
        f"{most_starts_in_window(spans, PERIOD)}"
    )
    assert drain.alive == [True, True]
    assert drain.exit_codes == [0, 0], drain.outputs
    assert drain.statuses == {"done": ITEMS}
    assert drain.attempts == {0: ITEMS}  # the outages consumed no attempt
    assert runs == {str(n): 1 for n in range(ITEMS)}  # each ran once, to its end
    check_limits(spans)
    assert any("database unavailable (" in output for output in drain.outputs)  # the outages were seen


# --- kill -9 and a runner whose clock is off ----------------------------------------------

SKEW_SETTINGS = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 3, "SHUTDOWN_GRACE": 2}
OFFSETS = {"+10m": 600.0, "-10m": -600.0}


def on_real_clock(spans: list[Span], skewed_pid: int, offset: float) -> list[Span]:
    """The skewed runner's stamps moved back to the real clock (libfaketime's offset is
    exact), so stamps from both runners compare."""
    moved = offset
    return [
        Span(s.kind, s.key, s.group, s.pid, s.started - moved, s.ended - moved) if s.pid == skewed_pid else s
        for s in spans
    ]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("offset", list(OFFSETS), ids=["ten-minutes-ahead", "ten-minutes-behind"])
def test_a_dead_runners_slot_and_key_come_back_on_reclaim_and_the_rate_holds_under_a_skewed_clock(
    offset: str, tmp_path: Path
) -> None:
    """A runner dies (kill -9) holding a slot and a key; a runner on the real clock and
    one ten minutes off carry on. The database's clock decides: the skewed runner neither
    reclaims early (ahead) nor late, the dead runner's slot and key stay held until the
    reclaim, and the rate window holds across both clocks."""
    ledger = tmp_path / "ledger"
    hang = tmp_path / "hang"
    # One thread per rescuer: while one runs an attempt the other takes the next, so
    # both clocks run work, and two slots (13 attempts a second) make the rate bind.
    args = ("runworkflows", "--kind", KIND, "--concurrency", "1")
    # One thread, busy with the hung attempt: the doomed runner claims nothing else.
    doomed = ManagePy("runworkflows", "--kind", KIND, "--concurrency", "1", settings=SKEW_SETTINGS)
    rescuers: list[ManagePy] = []
    try:
        enqueue(KIND, {"key": "hung", "to": "p", "ledger": str(ledger), "hang_file": str(hang)})
        wait_for(hang.exists, timeout=30, what="the first attempt to hang")
        wait_for(
            lambda: DeferredWork.objects.filter(dedupe_key="hung", started_at__isnull=False).exists(),
            timeout=30,
            what="the hung attempt's start marker",
        )
        # Four later items of the hung item's key, and fifty of other keys.
        later = [{"key": n, "to": "p", "ledger": str(ledger)} for n in range(1, 5)]
        others = [{"key": n, "to": f"q{n % 6}", "sleep": 0.15, "ledger": str(ledger)} for n in range(5, 55)]
        enqueue_many(KIND, later + others)
        rescuers = [
            ManagePy(*args, settings=SKEW_SETTINGS),
            ManagePy(*args, settings=SKEW_SETTINGS, **under_faketime(offset)),
        ]
        for rescuer in rescuers:
            rescuer.wait_for_output("runner started")
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(10)
        killed_at = time.time()
        row = DeferredWork.objects.get(dedupe_key="hung")
        assert row.status == Status.PROCESSING
        assert row.flow_slot is not None  # the dead runner's slot is still held
        last_heartbeat = row.heartbeat_at.timestamp()
        wait_for(
            lambda: not DeferredWork.objects.filter(status__in=[Status.PENDING, Status.PROCESSING]).exists(),
            timeout=120,
            interval=0.2,
            what="everything drained",
        )
        for rescuer in rescuers:
            assert rescuer.terminate() == 0, rescuer.output()
        outputs = [rescuer.output() for rescuer in rescuers]
    finally:
        doomed.close()
        for rescuer in rescuers:
            rescuer.close()

    spans = on_real_clock(read_spans(ledger), rescuers[1].pid, OFFSETS[offset])
    # The hung attempt never ended, so it wrote no span: every item ran once, to its end.
    assert Counter(span.key for span in spans) == {key: 1 for key in ["hung", *map(str, range(1, 55))]}
    reclaimed = next(span for span in spans if span.key == "hung")
    # Not before: the database's STALE_AFTER after the dead runner's last heartbeat,
    # whichever runner reclaimed it and whatever its own clock said.
    assert reclaimed.started >= last_heartbeat + SKEW_SETTINGS["STALE_AFTER"]
    assert DeferredWork.objects.get(dedupe_key="hung").attempt == 1
    assert sum("reclaimed from a runner that stopped heart-beating" in output for output in outputs) == 1
    # Until the reclaim the key stayed held (nothing of "p" started) and so did the
    # slot (at most one other attempt ran at a time).
    assert all(span.started >= reclaimed.ended for span in spans if span.group == "p" and span.key != "hung")
    while_held = [span for span in spans if killed_at <= span.started < reclaimed.started]
    assert while_held  # other keys did run meanwhile
    assert max_overlap(while_held) <= CONCURRENCY - 1
    check_limits(spans)
    # Both clocks ran work (the rate held across them).
    assert {span.pid for span in spans} == {rescuer.pid for rescuer in rescuers}, outputs
    assert FlowWindowSlot.objects.filter(name=f"workflow:{KIND}").count() == RATE

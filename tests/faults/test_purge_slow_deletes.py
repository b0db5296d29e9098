"""Fault suite: a backlog of expired rows that are slow to delete (big journals, many
indexes, a delete trigger, slow storage) and no ``statement_timeout`` at all. The runner
purges between its claims, in its loop thread: a batch of ``PURGE_BATCH_SIZE`` rows would
hold up every claim for as long as it runs. Its batches are sized to take about
``PURGE_BATCH_SECONDS`` (0.5 s by default) instead, so new work starts promptly while the
purge goes on.

The test database; a real ``FOR EACH ROW`` trigger makes each deleted row take 5 ms, so one
batch of ``PURGE_BATCH_SIZE`` (1,000, the default) would take 5.2 s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork
from tests.faults.purges import expired_count, is_done, make_expired, wait_for_runner
from tests.processes import ManagePy
from tests.testapp.models import Ledger

pytestmark = [pytest.mark.slow, pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

# pg_sleep(0.005) takes 5.1-5.2 ms: 1,000 rows (one batch of the default PURGE_BATCH_SIZE)
# take 5.2 s, 1,500 rows 7.8 s however they are batched.
ROW_DELETE_SECONDS = 0.005
EXPIRED = 1500
SETTINGS = {"POLL_INTERVAL": 0.2, "SWEEP_INTERVAL": 60}
# New work must start within 2 s of its enqueue while the purge goes on. A batch of 1,000
# rows would hold a claim up to 5.2 s, 2.6 times that; batches sized to the default 0.5 s
# hold it about 0.5 s, a quarter of it. The sleeps are the server's wall-clock time, which
# a loaded machine does not stretch; the 1.5 s left covers the runner's own turn.
START_WITHIN = 2.0
PURGE_DEADLINE = 30.0


def seconds_to_start(work_id: str, key: str) -> float:
    """From the enqueue (the row's ``created_at``) to its body running (the ledger row it
    writes first thing), both by this machine's clock."""
    ran = Ledger.objects.get(kind="test-ledger", key=key).created_at
    return (ran - DeferredWork.objects.get(pk=work_id).created_at).total_seconds()


def test_new_work_starts_promptly_while_slow_deletes_are_purged(
    slow_deletes: Any, report_figures: Callable[[str], None]
) -> None:
    make_expired(EXPIRED)
    slow_deletes.install(ROW_DELETE_SECONDS)
    runner = ManagePy("runworkflows", settings=SETTINGS)
    try:
        runner.wait_for_output("runner started", timeout=60)
        started = time.monotonic()
        # One item at a time, each done before the next is enqueued, while expired rows
        # are left: each is enqueued at some point of a purge batch.
        waits: list[float] = []
        number = 0
        while expired_count() and time.monotonic() - started < PURGE_DEADLINE:
            key = f"new-{number}"
            number += 1
            work_id = enqueue("test-ledger", {"key": key})
            assert work_id is not None
            wait_for_runner(runner, lambda work_id=work_id: is_done(work_id), timeout=15, what=f"{key} done")
            if expired_count():
                waits.append(seconds_to_start(work_id, key))
        purging_for = time.monotonic() - started
        slow_deletes.set_delay(0)
        wait_for_runner(runner, lambda: expired_count() == 0, timeout=30, what="the expired rows purged")
        assert runner.terminate() == 0, runner.output()
        output = runner.output()
    finally:
        runner.close()
    report_figures(
        f"slow deletes ({ROW_DELETE_SECONDS * 1000:g} ms a row, no statement_timeout): "
        f"{len(waits)} new items started during {purging_for:.1f}s of purging, enqueue to start median "
        f"{statistics.median(waits) if waits else 0:.3f}s, longest {max(waits, default=0):.3f}s"
    )
    assert len(waits) >= 5, output
    assert max(waits) < START_WITHIN, (waits, output)
    for noise in ("WARNING", "ERROR", "Traceback"):
        assert noise not in output, output

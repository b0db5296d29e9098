"""Fault suite: a ``statement_timeout`` shorter than one purge batch's ``DELETE`` (a bloated
table, slow storage, a low timeout on the app's role). PostgreSQL cancels the batch
(``QueryCanceled``, SQLSTATE 57014); that is no outage: the runner halves its purge batch,
says so once, keeps claiming, and the purge gets through with the smaller batches.

The test database, not a private cluster: the timeout is the runner's alone (its
``DATABASE_URL`` carries ``options=-c statement_timeout=…``), and a real ``FOR EACH ROW``
trigger makes each deleted row of the work table take a few milliseconds, so a batch of
1000 is over the timeout and one of 500 well under it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from nexus_workflows import enqueue
from tests.faults.purges import (
    expired_count,
    is_done,
    make_expired,
    purge_delete_pid,
    wait_for_runner,
    warnings_of,
    with_statement_timeout,
)
from tests.processes import ManagePy, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

TIMEOUT_MS = 3500
# pg_sleep(0.005) takes 5.1-5.2 ms (shorter sleeps round up unevenly: 0.003 takes 4.1 ms):
# a batch of 1000 rows takes 5.2 s and is cancelled at 3.5 s; one of 500 takes 2.6 s.
ROW_DELETE_SECONDS = 0.005
# Four batches of 500 after the cancelled one: were the size to double back after three
# (purge_batches.GROW_AFTER) whatever they took, the fourth would be cancelled too.
EXPIRED = 2000
# Polls often; the sweep comes round once a minute (the default), longer than the test:
# a purge that waited for the next sweep after a cancel would not finish within it.
SETTINGS = {"POLL_INTERVAL": 0.2, "SWEEP_INTERVAL": 60, "PURGE_BATCH_SIZE": 1000, "PURGE_BATCH_SECONDS": 10}
PURGE_DEADLINE = 40.0


def test_a_purge_batch_over_statement_timeout_shrinks_and_the_runner_keeps_claiming(
    slow_deletes: Any, report_figures: Callable[[str], None]
) -> None:
    make_expired(EXPIRED)
    # Until its row is purged, an expired done key still holds its key: a purge that
    # never progresses stretches the dedupe horizon for ever.
    assert enqueue("test-ledger", {"key": "expired-0"}) is None
    slow_deletes.install(ROW_DELETE_SECONDS)
    runner = ManagePy("runworkflows", settings=SETTINGS, database_url=with_statement_timeout(TIMEOUT_MS))
    try:
        runner.wait_for_output("runner started", timeout=60)
        started = time.monotonic()
        # New work, one item at a time, each done before the next is enqueued: the
        # runner claims and finishes work while the purge goes on.
        finished_while_purging = 0
        number = 0
        while expired_count() and time.monotonic() - started < PURGE_DEADLINE:
            work_id = enqueue("test-ledger", {"key": f"new-{number}"})
            number += 1
            assert work_id is not None
            wait_for_runner(
                runner, lambda work_id=work_id: is_done(work_id), timeout=15, what=f"new-{number - 1} done"
            )
            finished_while_purging += bool(expired_count())
        purged_in = time.monotonic() - started
        left = expired_count()
        assert left == 0, f"{left} expired rows left after {purged_in:.1f}s; output:\n{runner.output()}"
        assert runner.process.poll() is None  # alive
        assert runner.terminate() == 0, runner.output()
        output = runner.output()
    finally:
        runner.close()
    report_figures(
        f"purge under statement_timeout {TIMEOUT_MS} ms ({ROW_DELETE_SECONDS * 1000:g} ms per deleted row): "
        f"{EXPIRED} expired rows purged in {purged_in:.1f}s; {number} new items done meanwhile, "
        f"{finished_while_purging} of them while expired rows were left"
    )
    assert finished_while_purging >= 2, output
    assert "database unavailable" not in output, output
    # Only halvings, the first of 1000 rows. Nominally that one is all (500 rows take 2.6 s),
    # but a loaded machine may stretch the sleeps past the timeout and halve once more.
    warnings = warnings_of(output)
    shrank = r"a purge batch of (\d+) rows was cancelled .*; purging (\d+) rows at a time from now on$"
    halvings = [re.search(shrank, line) for line in warnings]
    assert warnings, output
    assert all(halvings), output
    first = halvings[0]
    assert first is not None
    assert (int(first[1]), int(first[2])) == (1000, 500), output
    for noise in ("ERROR", "Traceback"):
        assert noise not in output, output
    # The key is free again once its row is gone.
    assert enqueue("test-ledger", {"key": "expired-0"}) is not None


def test_a_purge_of_one_row_cancelled_waits_for_the_next_sweep_and_wedges_nothing(slow_deletes: Any) -> None:
    """Even one row's DELETE is over the timeout: the runner says so once, keeps claiming,
    tries again each sweep (quietly), and purges (growing its batches back) once deletes
    are quick again."""
    make_expired(5)
    slow_deletes.install(2.0)  # a row takes 2 s: cancelled at 1 s, whatever the batch
    settings = {"POLL_INTERVAL": 0.2, "SWEEP_INTERVAL": 2, "PURGE_BATCH_SIZE": 2}
    # -v 2: the quiet retries are DEBUG lines, which the test waits for.
    runner = ManagePy("runworkflows", "-v", "2", settings=settings, database_url=with_statement_timeout(1000))
    try:
        runner.wait_for_output("runner started", timeout=60)
        again = "a purge batch of 1 row was cancelled again"
        wait_for_runner(
            runner, lambda: runner.output().count(again) >= 2, timeout=30, what="two retries at later sweeps"
        )
        work_id = enqueue("test-ledger", {"key": "new"})
        assert work_id is not None
        wait_for_runner(runner, lambda: is_done(work_id), timeout=15, what="new work done")
        assert expired_count() == 5  # every cancelled batch rolled back
        slow_deletes.set_delay(0)  # the table is quick again
        wait_for_runner(runner, lambda: expired_count() == 0, timeout=15, what="the expired rows purged")
        assert runner.terminate() == 0, runner.output()
        output = runner.output()
    finally:
        runner.close()
    warnings = warnings_of(output)
    assert len(warnings) == 2, output
    assert warnings[0].endswith(
        "a purge batch of 2 rows was cancelled by the database (statement_timeout?); "
        "purging 1 row at a time from now on"
    ), output
    assert warnings[1].endswith(
        "a purge batch of 1 row was cancelled by the database (statement_timeout?); "
        "trying again at the next sweep, in 2s (SWEEP_INTERVAL)"
    ), output
    # Three quick batches of one row (a cancel took a second; these, milliseconds): two.
    assert "purge batches completed quickly; purging 2 rows at a time again" in output, output
    for noise in ("database unavailable", "ERROR", "Traceback"):
        assert noise not in output, output


def test_an_early_pg_cancel_backend_does_not_stop_the_batches_growing_back(slow_deletes: Any) -> None:
    """Someone cancels a purge batch by hand a moment after it began (``pg_cancel_backend``:
    57014 too). The size halves, as for a timeout, but what limits a batch is the session's
    real ``statement_timeout`` (20 s here), not how long the cancelled batch happened to run:
    quick batches grow back. Were that run (a few hundredths of a second) the yardstick, a
    batch of 4 rows (0.2 s) would never count as quick and the size would stay halved."""
    make_expired(40)
    slow_deletes.install(0.05)  # 8 rows take 0.4 s: time to find the DELETE and cancel it
    # PURGE_BATCH_SECONDS: 5 s, so only the timeout can hold the size down (batches are 0.2-0.4 s).
    settings = {"POLL_INTERVAL": 0.2, "SWEEP_INTERVAL": 60, "PURGE_BATCH_SIZE": 8, "PURGE_BATCH_SECONDS": 5}
    runner = ManagePy("runworkflows", settings=settings, database_url=with_statement_timeout(20_000))
    try:
        pid = wait_for(purge_delete_pid, timeout=60, interval=0.01, what="the runner's first purge DELETE")
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_cancel_backend(%s)", [pid])
        halved = "a purge batch of 8 rows was cancelled by the database (statement_timeout?); purging 4 rows"
        wait_for_runner(runner, lambda: halved in runner.output(), timeout=15, what="the halving")
        grew = "purge batches completed quickly; purging 8 rows at a time again"
        wait_for_runner(runner, lambda: grew in runner.output(), timeout=20, what="the size growing back")
        wait_for_runner(runner, lambda: expired_count() == 0, timeout=20, what="the expired rows purged")
        assert runner.terminate() == 0, runner.output()
        output = runner.output()
    finally:
        runner.close()
    assert len(warnings_of(output)) == 1, output  # the halving, and nothing else
    for noise in ("database unavailable", "ERROR", "Traceback"):
        assert noise not in output, output

"""Fault suite: a row lock held for long on an expired row (an admin's or an ORM's
``select_for_update()`` on old rows, a data export that updated one and stays open, a
session idle in its transaction), and a role with no ``lock_timeout`` of its own
(PostgreSQL's default: wait for ever; MariaDB's ``innodb_lock_wait_timeout``: 50 s).

The runner purges between its claims, in its loop thread. Its batches wait for a lock at
most ``PURGE_BATCH_SECONDS`` (MariaDB: whole seconds, so 1 s) whatever the role's
settings, then the batch is a conflict like any other (``test_purge_lock_conflicts.py``):
tried again at the next turn, then once a sweep. So new work enqueued while the lock is
held starts promptly, and the expired rows are purged once it is released.

The test database (PostgreSQL or MariaDB; SQLite has no row locks); a session of the
test's own holds the lock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest
from django.db import connection

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork
from tests.faults.purges import (
    expired_count,
    is_done,
    make_expired,
    purge_waits_for_a_lock,
    wait_for_runner,
    warnings_of,
    with_session_settings,
)
from tests.processes import ManagePy, url_of_test_database
from tests.raw_connections import row_locked
from tests.testapp.models import Ledger

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs("row_locks"),
    pytest.mark.django_db(transaction=True),
]

# The purge comes round every 2 s after a failed retry; -v 2 shows the quiet retries.
SETTINGS = {"POLL_INTERVAL": 0.2, "SWEEP_INTERVAL": 2}
# New work enqueued while the lock is held must start within this: a batch waits for the
# lock at most PURGE_BATCH_SECONDS (0.5 s; 1 s on MariaDB, in whole seconds), twice in a
# row at most (the retry at the next turn), and the runner's own turn takes the rest.
START_WITHIN = {"postgresql": 2.0, "mysql": 3.0}
# How long the lock is held while new work comes in: three sweeps, so that items are
# enqueued during the purge's waits, not only between them.
HOLD_FOR = 6.0
# What the runner says once, naming the database's own setting.
CONFLICT = {
    "postgresql": "it waited longer than lock_timeout for a lock",
    "mysql": "it waited longer than innodb_lock_wait_timeout for a lock",
}


def seconds_to_start(work_id: str, key: str) -> float:
    """From the enqueue (the row's ``created_at``) to its body running (the ledger row it
    writes first thing), both by this machine's clock."""
    ran = Ledger.objects.get(kind="test-ledger", key=key).created_at
    return (ran - DeferredWork.objects.get(pk=work_id).created_at).total_seconds()


def runner_without_a_lock_timeout() -> ManagePy:
    # PostgreSQL: lock_timeout 0 (none) explicitly; MariaDB: the server's 50 s.
    postgresql = connection.vendor == "postgresql"
    url = with_session_settings(lock_timeout=0) if postgresql else url_of_test_database()
    return ManagePy("runworkflows", "-v", "2", settings=SETTINGS, database_url=url)


def test_new_work_starts_promptly_while_a_row_lock_holds_the_purge_back(
    report_figures: Callable[[str], None],
) -> None:
    make_expired(5)
    locked = DeferredWork.objects.filter(dedupe_key="expired-2").get().pk
    with row_locked(DeferredWork, locked) as release:
        runner = runner_without_a_lock_timeout()
        try:
            wait_for_runner(runner, purge_waits_for_a_lock, timeout=60, what="the purge waiting for the lock")
            started = time.monotonic()
            waits: list[float] = []
            while time.monotonic() - started < HOLD_FOR:
                key = f"new-{len(waits)}"
                work_id = enqueue("test-ledger", {"key": key})
                assert work_id is not None
                wait_for_runner(
                    runner, lambda work_id=work_id: is_done(work_id), timeout=20, what=f"{key} done"
                )
                waits.append(seconds_to_start(work_id, key))
            assert expired_count() == 5  # the lock held the whole batch back, as it should
            assert "a purge batch did not pass again" in runner.output()  # tried at a sweep
            release()
            wait_for_runner(runner, lambda: expired_count() == 0, timeout=15, what="the expired rows purged")
            assert runner.terminate() == 0, runner.output()
            output = runner.output()
        finally:
            runner.close()
    warnings = warnings_of(output)
    assert len(warnings) == 1, output
    assert warnings[0].endswith(
        f"a purge batch did not pass ({CONFLICT[connection.vendor]}); not an outage: trying again at the "
        "next turn, then at each sweep (SWEEP_INTERVAL) while it fails"
    ), output
    for noise in ("database unavailable", "database reachable again", "ERROR", "Traceback"):
        assert noise not in output, output
    report_figures(
        f"a row lock held {HOLD_FOR:g}s on an expired row, no lock_timeout ({connection.vendor}): "
        f"{len(waits)} new items, enqueue to start median {statistics.median(waits):.3f}s, "
        f"longest {max(waits):.3f}s"
    )
    assert max(waits) < START_WITHIN[connection.vendor], waits

"""Fault suite: a purge batch that meets another transaction. Its ``DELETE`` waits longer
than the session's ``lock_timeout`` for a row another session locked (SQLSTATE 55P03), is
chosen to break a deadlock (40P01), or meets a concurrent update under REPEATABLE READ
(40001). The database is fine: the runner says so once, keeps claiming, tries the batch
again at the next turn (then at each sweep while it keeps failing), and never takes the
outage path ("database unavailable", claims skipped, back-off).

The test database; each runner's sessions get their settings through ``DATABASE_URL``
(``options=-c …``), and a psycopg connection of the test's own holds the locks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork
from tests.faults.purges import (
    expired_count,
    is_done,
    make_expired,
    purge_delete_pid,
    wait_for_runner,
    warnings_of,
    with_session_settings,
)
from tests.processes import ManagePy, wait_for
from tests.raw_connections import raw_connection

pytestmark = [pytest.mark.slow, pytest.mark.postgresql, pytest.mark.django_db(transaction=True)]

# The purge comes round every 2 s after a failed retry; the runner's -v 2 shows its quiet
# (DEBUG) retries.
SETTINGS = {"POLL_INTERVAL": 0.2, "SWEEP_INTERVAL": 2}
# A batch waits for a lock at most PURGE_BATCH_SECONDS: long enough here for the test to
# close a deadlock (the runner's deadlock_timeout is 1 s) or commit an update while the
# runner's DELETE waits, so that it meets those and not its own bound first.
WAITS_LONG = {**SETTINGS, "PURGE_BATCH_SECONDS": 5}
TABLE = DeferredWork._meta.db_table


@pytest.fixture
def other_session() -> Iterator[Any]:
    """A psycopg session of the test's own, in a transaction it rolls back at the end."""
    session = raw_connection()
    session.execute("SET deadlock_timeout = '60s'")  # never the one to break a deadlock
    session.execute("BEGIN")
    try:
        yield session
    finally:
        session.close()


def expired_ids() -> list[int]:
    return list(
        DeferredWork.objects.filter(dedupe_key__startswith="expired-")
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def lock_row(session: Any, pk: int) -> None:
    session.execute(f'SELECT 1 FROM "{TABLE}" WHERE id = %s FOR UPDATE', [pk])


def start_runner(settings: dict[str, Any] | None = None, **session_settings: str | int) -> ManagePy:
    # -v 2: the quiet retries are DEBUG lines.
    return ManagePy(
        "runworkflows",
        "-v",
        "2",
        settings=settings or SETTINGS,
        database_url=with_session_settings(**session_settings),
    )


def new_work_is_done(runner: ManagePy) -> None:
    work_id = enqueue("test-ledger", {"key": "new"})
    assert work_id is not None
    wait_for_runner(runner, lambda: is_done(work_id), timeout=15, what="new work done")


def stop_and_check(runner: ManagePy, warning: str) -> str:
    """Stop the runner; its only WARNING is ``warning``, and it never saw an outage."""
    assert runner.terminate() == 0, runner.output()
    output = runner.output()
    warnings = warnings_of(output)
    assert len(warnings) == 1, output
    assert warnings[0].endswith(warning), output
    for noise in ("database unavailable", "database reachable again", "ERROR", "Traceback"):
        assert noise not in output, output
    return output


def test_a_purge_batch_over_lock_timeout_is_tried_again_not_an_outage(other_session: Any) -> None:
    """Another session holds a row lock on an expired row, for longer than many sweeps:
    every batch (all five rows) waits 0.3 s for it and gives up. One WARNING, a retry at
    the next turn, then one quiet try per sweep; claims go on; the purge passes once the
    lock is gone."""
    make_expired(5)
    lock_row(other_session, expired_ids()[2])
    runner = start_runner(lock_timeout="300ms")
    try:
        again = "a purge batch did not pass again"
        wait_for_runner(
            runner, lambda: runner.output().count(again) >= 3, timeout=30, what="three quiet retries"
        )
        new_work_is_done(runner)
        assert expired_count() == 5
        other_session.execute("ROLLBACK")
        wait_for_runner(runner, lambda: expired_count() == 0, timeout=15, what="the expired rows purged")
        output = stop_and_check(
            runner,
            "a purge batch did not pass (it waited longer than lock_timeout for a lock); not an outage: "
            "trying again at the next turn, then at each sweep (SWEEP_INTERVAL) while it fails",
        )
    finally:
        runner.close()
    # The retry at the next turn, then one each sweep (2 s apart): not a retry each turn.
    assert output.count(again) < 15, output


def test_a_purge_batch_in_a_deadlock_is_tried_again_not_an_outage(other_session: Any) -> None:
    """The runner's DELETE holds the first of two expired rows and waits for the second,
    which another session locked; that session then asks for the first: a deadlock, which
    the runner's session breaks (its deadlock_timeout, 1 s, ends before the other's)."""
    make_expired(2)
    first, second = expired_ids()
    lock_row(other_session, second)
    runner = start_runner(WAITS_LONG)
    try:
        wait_for(
            lambda: purge_delete_pid(waiting_for_a_lock=True),
            timeout=60,
            what="the purge waiting for the lock",
        )
        lock_row(other_session, first)  # returns once the runner's DELETE was cancelled
        other_session.execute("ROLLBACK")
        wait_for_runner(runner, lambda: expired_count() == 0, timeout=15, what="the expired rows purged")
        new_work_is_done(runner)
        stop_and_check(
            runner,
            "a purge batch did not pass (the database ended it to break a deadlock); not an outage: "
            "trying again at the next turn, then at each sweep (SWEEP_INTERVAL) while it fails",
        )
    finally:
        runner.close()


def test_a_purge_batch_meeting_a_concurrent_update_under_repeatable_read_is_tried_again(
    other_session: Any,
) -> None:
    """The runner's sessions run REPEATABLE READ. Its DELETE waits for a row another session
    updated (still expired), and that update commits: the DELETE cannot serialize (40001).
    The next turn's batch, on a new snapshot, deletes every row."""
    make_expired(5)
    other_session.execute(f'UPDATE "{TABLE}" SET updated_at = updated_at WHERE id = %s', [expired_ids()[2]])
    runner = start_runner(WAITS_LONG, default_transaction_isolation="repeatable\\ read")
    try:
        wait_for(
            lambda: purge_delete_pid(waiting_for_a_lock=True),
            timeout=60,
            what="the purge waiting for the lock",
        )
        other_session.execute("COMMIT")
        wait_for_runner(runner, lambda: expired_count() == 0, timeout=15, what="the expired rows purged")
        new_work_is_done(runner)
        stop_and_check(
            runner,
            "a purge batch did not pass (it met a concurrent update: serialization failure); not an outage: "
            "trying again at the next turn, then at each sweep (SWEEP_INTERVAL) while it fails",
        )
    finally:
        runner.close()

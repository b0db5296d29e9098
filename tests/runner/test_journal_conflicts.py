"""A journal batch the database ends to break a deadlock is written again, not failed: the
runner's heartbeat (and its start marks) update the same rows, many in one statement, in
the order of their own plans. In CI a rate-limited kind with 200 async attempts in flight
had its one batch of 200 first saves end so, and every attempt failed ("failed
(OperationalError)", all 200 rescheduled) for no fault of its own.

And a batch the database refused for one row's value (a project's trigger) fails only
that row's save: the others are written alone.

The deadlock is made on purpose: another session (as the heartbeat) holds the batch's
second row, the batch takes the first and waits, then that session updates the first row
too. Its own ``deadlock_timeout`` is long, so the batch's session is the one PostgreSQL
ends (after its default second)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
from django.db import DatabaseError

from nexus_workflows import enqueue
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.runner.journal import JournalWriter, _Save
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.models import DeferredWork
from tests.processes import wait_for
from tests.raw_connections import raw_connection, row_locked

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = DeferredWork._meta.db_table


def claimed_pair(register_workflow: Any) -> list[ClaimedWork]:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    for key in ("a", "b"):
        enqueue(kind, {"key": key})
    return sorted(Claimer(kinds=[kind], using="default").claim_due(2), key=lambda work: work.id)


def lock_waits(backend: int) -> bool:
    with raw_connection() as watcher:
        row = watcher.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [backend]
        ).fetchone()
        return bool(row and row[0])


@pytest.mark.postgresql
def test_a_batch_ended_by_a_deadlock_is_written_again(register_workflow: Any) -> None:
    first, second = claimed_pair(register_workflow)
    writer = JournalWriter("default", 1)
    saves = [_Save(work, {"step": work.id}, written=threading.Event()) for work in (first, second)]
    backend: dict[str, int] = {}

    def write() -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            backend["pid"] = cursor.fetchone()[0]
        try:
            writer._write(saves)  # as its writer thread does: the batch, in this order
        finally:
            connection.close()

    with raw_connection() as heartbeat:
        heartbeat.execute("SET deadlock_timeout = '30s'")  # the batch's session detects it
        heartbeat.execute("BEGIN")
        heartbeat.execute(f"UPDATE {TABLE} SET heartbeat_at = now() WHERE id = %s", [second.id])
        batch = threading.Thread(target=write)
        batch.start()
        wait_for(
            lambda: "pid" in backend and lock_waits(backend["pid"]), timeout=10, what="the batch to wait"
        )
        # The batch holds the first row and waits for the second: this closes the cycle.
        heartbeat.execute(f"UPDATE {TABLE} SET heartbeat_at = now() WHERE id = %s", [first.id])
        heartbeat.execute("COMMIT")
        batch.join(30)
    assert not batch.is_alive()
    assert [save.error for save in saves] == [None, None]
    assert list(
        DeferredWork.objects.filter(pk__in=[first.id, second.id])
        .order_by("pk")
        .values_list("checkpoints", flat=True)
    ) == [
        {"step": first.id},
        {"step": second.id},
    ]


@pytest.mark.needs("row_locks")
def test_a_batch_whose_lock_wait_was_cut_short_fails_only_the_locked_rows_save(
    register_workflow: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock wait cut short (``lock_timeout``, ``innodb_lock_wait_timeout``) has waited its
    whole timeout already: the save of the row another session holds fails with the
    database's error (the attempt's refusal rules), not after three more waits; the
    batch's other saves are written, skipping that row. On the old code every save of the
    batch failed (up to 200 attempts, for one row an operator held)."""
    from django.db import OperationalError, connection

    first, second = claimed_pair(register_workflow)
    writer = JournalWriter("default", 1)
    saves = [_Save(work, {"step": 1}, written=threading.Event()) for work in (first, second)]
    with row_locked(DeferredWork, second.id), caplog.at_level(logging.INFO, logger="nexus_workflows"):
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
            else:
                cursor.execute("SET lock_timeout = '200ms'")
        try:
            writer._write(saves)
        finally:
            connection.close()  # the session's lock wait setting goes with it
    assert [type(save.error) for save in saves] == [type(None), OperationalError]
    assert "writing it again" not in caplog.text
    checkpoints = dict(
        DeferredWork.objects.filter(pk__in=[first.id, second.id]).values_list("pk", "checkpoints")
    )
    assert checkpoints == {first.id: {"step": 1}, second.id: {}}


def test_a_batch_refused_for_one_rows_write_fails_only_that_save(
    register_workflow: Any, write_blocker: Any
) -> None:
    """On the old code both saves failed with the trigger's error: the whole batch."""
    first, second = claimed_pair(register_workflow)
    writer = JournalWriter("default", 1)
    saves = [_Save(work, {"step": work.id}, written=threading.Event()) for work in (first, second)]
    write_blocker.install(f"NEW.id = {second.id}")
    writer._write(saves)
    assert saves[0].error is None
    assert isinstance(saves[1].error, DatabaseError)  # the trigger's (its type differs by vendor)
    checkpoints = dict(
        DeferredWork.objects.filter(pk__in=[first.id, second.id]).values_list("pk", "checkpoints")
    )
    assert checkpoints == {first.id: {"step": first.id}, second.id: {}}

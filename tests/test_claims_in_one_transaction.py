"""A claim of several statements is one transaction: a failure between them leaves no row
claimed and unreturned (processing, never run nor heart-beaten, holding its slot and key
until ``STALE_AFTER``).

The statements: on MariaDB (no ``UPDATE … RETURNING``) a claim is an ``UPDATE`` and a read
of its rows by claim token; a stale reclaim is two ``UPDATE``s (a lost attempt that had
started, one that had not), each read back on MariaDB. The faults are real ones: the
server kills the claiming session between the ``UPDATE`` and its read (MariaDB), and a
lock wait cut short by the session's lock timeout in the second ``UPDATE`` of a reclaim
(PostgreSQL and MariaDB; SQLite has one writer and no row locks: the first ``UPDATE``
would wait as well).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.db.models.functions import Now

from nexus_workflows import enqueue_many
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.models import DeferredWork, Status
from tests.processes import wait_for
from tests.raw_connections import updates_wait_for_a_lock

pytestmark = pytest.mark.django_db(transaction=True)

STALE_AFTER = timedelta(minutes=5)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def claimer(kind: str) -> Claimer:
    return Claimer(kinds=[kind], using="default")


def pending(kind: str) -> int:
    return DeferredWork.objects.filter(kind=kind, status=Status.PENDING).count()


@contextlib.contextmanager
def session_killed_before_the_read_back() -> Iterator[list[str]]:
    """Another session KILLs this one (MariaDB) right before it reads its claimed rows
    back by token: Django's ``execute_wrapper``, the documented hook around every query,
    sees the read coming. Yields the statements seen."""
    import MySQLdb

    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (session_id,) = cursor.fetchone()
    killer = MySQLdb.connect(**connection.get_connection_params())
    seen: list[str] = []

    def kill_before_read(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        if sql.lstrip().upper().startswith("SELECT") and "claim_token" in sql:
            killer.cursor().execute(f"KILL {int(session_id)}")
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(kill_before_read):
            yield seen
    finally:
        killer.close()
        connection.close()  # the killed session: the next query reconnects


@pytest.mark.mysql
def test_a_session_killed_between_the_claim_and_its_read_leaves_the_rows_pending(
    register_workflow: Any,
) -> None:
    kind = register_workflow(noop, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": n} for n in range(3)])
    with session_killed_before_the_read_back() as seen, pytest.raises(DatabaseError):
        claimer(kind).claim_due(10)
    assert any(sql.lstrip().upper().startswith("UPDATE") for sql in seen)  # the claim ran first
    # The server rolls the killed session's transaction back.
    wait_for(lambda: pending(kind) == 3, timeout=10, what="the claim to be rolled back")
    assert len(claimer(kind).claim_due(10)) == 3  # the next claim takes them at once


@pytest.mark.mysql
def test_a_session_killed_between_a_reclaim_and_its_read_leaves_the_rows_stale(
    register_workflow: Any,
) -> None:
    kind = register_workflow(noop, retry_schedule=[1, 1]).kind
    enqueue_many(kind, [{"key": n} for n in range(2)])
    assert len(claimer(kind).claim_due(10)) == 2
    DeferredWork.objects.update(heartbeat_at=Now() - timedelta(hours=1), started_at=Now())
    with session_killed_before_the_read_back(), pytest.raises(DatabaseError):
        claimer(kind).claim_stale(10, stale_after=STALE_AFTER)
    wait_for(
        lambda: len(claimer(kind).claim_stale(10, stale_after=STALE_AFTER)) == 2,
        timeout=10,
        what="the rows to be stale again and reclaimed",
    )


@contextlib.contextmanager
def short_lock_waits() -> Iterator[None]:
    """This session waits at most 200 ms for a row lock."""
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = 200")
    try:
        yield
    finally:
        connection.close()


@pytest.mark.postgresql
def test_a_reclaim_whose_second_update_fails_hands_out_or_keeps_stale_what_the_first_took(
    register_workflow: Any,
) -> None:
    """The reclaim's first ``UPDATE`` takes the lost attempt that had started; the second,
    the one that had not, waits for a lock (a trigger's: a row another session locked is
    skipped now) and is cut short. The
    first one's row must not be left claimed by nobody: it is still stale, and the next
    reclaim takes it at once. PostgreSQL only: MariaDB's first ``UPDATE`` locks every row
    it names by primary key before it checks the rest of its condition, so there the
    first one waits (and fails) instead; the session killed above is its window."""
    kind = register_workflow(noop, retry_schedule=[1, 1]).kind
    enqueue_many(kind, [{"key": n} for n in range(2)])
    started, unstarted = sorted(work.id for work in claimer(kind).claim_due(10))
    DeferredWork.objects.update(heartbeat_at=Now() - timedelta(hours=1))
    DeferredWork.objects.filter(pk=started).update(started_at=Now())
    # The second UPDATE waits for a lock (a lock on the row itself is skipped now).
    waits = f"OLD.id = {int(unstarted)} AND NEW.status = 'processing'"
    with updates_wait_for_a_lock(DeferredWork, waits) as release, short_lock_waits():
        with pytest.raises(DatabaseError):
            claimer(kind).claim_stale(10, stale_after=STALE_AFTER)
        release()
        reclaimed = claimer(kind).claim_stale(10, stale_after=STALE_AFTER)
    assert sorted(work.id for work in reclaimed) == [started, unstarted]
    assert [work.lost_started for work in sorted(reclaimed, key=lambda work: work.id)] == [True, False]

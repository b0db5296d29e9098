"""Two waits on a statement that does not answer (as a silent network would: a lock
another session holds, which a trigger of the table waits for, for the journal writers,
which skip locked rows; a row lock for the heartbeat): the journal writers' stop is
bounded as a whole, and fails the saves a stuck writer holds; a heartbeat's confirmation
counts from when its statement was sent. PostgreSQL and MariaDB (real locks; SQLite locks
the whole database)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connections

from nexus_workflows import ClaimLost, enqueue
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.runner import journal
from nexus_workflows.deferred.runner.heartbeat import Heartbeat
from nexus_workflows.deferred.runner.journal import JournalWriter
from nexus_workflows.deferred.runner.ledger import Ledger
from nexus_workflows.models import DeferredWork
from tests.processes import wait_for
from tests.raw_connections import lock_waits, row_locked, updates_wait_for_a_lock

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.needs("row_locks")]


#: Seconds between polls of lock_waits (see there).
POLL = 0.2


def claimed(kind: str, count: int) -> list[Any]:
    for number in range(count):
        enqueue(kind, {"key": str(number)})
    return Claimer(kinds=[kind], using="default").claim_due(count)


def test_the_writers_stop_within_one_wait_and_fail_the_saves_a_stuck_writer_holds(
    register_workflow: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the old code each writer was joined for 5 s in turn, and a save in the hands of a
    writer stuck on its statement kept its caller waiting as long as the statement did
    (here: until the lock went, after the test gave up). And later, once its statement
    returned, a writer stuck at the stop never ended: the stop had taken its end marker
    from the queue, so it waited for work for ever, its connection open."""
    monkeypatch.setattr(journal, "STOP_WAIT", 0.5, raising=False)
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    works = claimed(kind, 2)
    writer = JournalWriter("default", 2)
    writer.start()
    raised: dict[int, BaseException] = {}

    def save(work: Any) -> None:
        try:
            writer.save(work, {"step": 1})
        except BaseException as error:  # noqa: BLE001 - checked below
            raised[work.id] = error
        finally:
            connections.close_all()

    with updates_wait_for_a_lock(DeferredWork, f"NEW.id IN ({works[0].id}, {works[1].id})"):
        savers = [threading.Thread(target=save, args=(work,)) for work in works]
        for saver in savers:
            saver.start()
        wait_for(lambda: lock_waits() >= 1, timeout=10, interval=POLL, what="a writer waiting for a row lock")
        stopper = threading.Thread(target=writer.stop)
        stopper.start()
        # Both while the locks are still held: nothing waits for the stuck statement.
        wait_for(lambda: not stopper.is_alive(), timeout=3, what="the writers' stop")
        wait_for(lambda: len(raised) == 2, timeout=3, what="the stuck saves to fail")
    for thread in [*savers, *writer._threads]:  # the stuck writers end once the lock went
        thread.join(10)
    assert not [thread.name for thread in writer._threads if thread.is_alive()], "a stuck writer never ended"
    assert all(isinstance(error, ClaimLost) for error in raised.values()), raised
    assert all("the runner stopped" in str(error) for error in raised.values())


def test_a_heartbeat_confirms_the_claims_from_when_it_was_sent(register_workflow: Any) -> None:
    """On the old code the last good heartbeat was stamped when its statement returned:
    a beat that waited (a lock, a stalled network) looked newer than the rows it wrote.
    The beat that waits for a row lock is the one for the rows the last beat skipped."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    (work,) = claimed(kind, 1)
    ledger = Ledger()
    ledger.dispatch([work])
    heartbeat = Heartbeat(ledger, using="default", interval=0.01, stale_after=30, on_beat=lambda: None)

    def beat_behind() -> None:
        try:
            heartbeat._beat_behind(time.monotonic() + 30, most=30)
        finally:
            connections.close_all()

    with row_locked(DeferredWork, work.id) as release:
        heartbeat._turn(0.0)  # skips the locked row
        assert heartbeat._behind == [work]
        beating = threading.Thread(target=beat_behind)
        beating.start()
        what = "the heartbeat waiting for the row lock"
        wait_for(lambda: lock_waits() >= 1, timeout=10, interval=POLL, what=what)
        released_at = time.monotonic()
        release()
        beating.join(10)
    assert not beating.is_alive()
    assert heartbeat._behind == []
    assert ledger._confirmed[work.key] < released_at  # sent before, answered after

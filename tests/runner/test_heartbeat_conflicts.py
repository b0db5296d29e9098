"""A heartbeat or a start mark never waits for a row another session holds a lock on (a
journal batch's transaction, an operator's ``SELECT … FOR UPDATE``, a backfill): it skips
that row and writes the others, so one locked row holds no other row's beat back. The
skipped row's beat waits for its lock between beats (the runner is then first in line when
the lock goes); its mark is written at a later turn.

Before, the beat's one ``UPDATE`` of every held row waited for the locked one: every other
row went stale meanwhile and another runner reclaimed attempts still running
(``test_locked_rows.py`` shows that with two runners). A beat and a journal batch could
also deadlock, which the beat survived by writing again."""

from __future__ import annotations

import time
from typing import Any

import pytest

from nexus_workflows.deferred.runner.heartbeat import Heartbeat
from nexus_workflows.deferred.runner.ledger import SYNC, Ledger
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.models import DeferredWork
from tests.raw_connections import row_locked
from tests.runner.test_journal_conflicts import claimed_pair

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.needs("row_locks")]


def heartbeat_of(works: list[ClaimedWork]) -> Heartbeat:
    ledger = Ledger()
    ledger.dispatch(works)
    return Heartbeat(ledger, using="default", interval=60, stale_after=300, on_beat=lambda: None)


def column(name: str, works: list[ClaimedWork]) -> list[Any]:
    return [DeferredWork.objects.get(pk=work.id).__dict__[name] for work in works]


def test_a_beat_skips_a_row_another_session_holds_and_waits_for_it_between_beats(
    register_workflow: Any,
) -> None:
    first, second = claimed_pair(register_workflow)
    DeferredWork.objects.update(heartbeat_at=None)
    heartbeat = heartbeat_of([first, second])
    with row_locked(DeferredWork, second.id) as release:
        began = time.monotonic()
        heartbeat._turn(0.0)  # a beat is due
        assert time.monotonic() - began < 5  # it did not wait for the lock
        beaten, skipped = column("heartbeat_at", [first, second])
        assert beaten is not None
        assert skipped is None
        assert heartbeat._behind == [second]
        # Between beats it waits for the lock, a bounded while (no failed beat).
        heartbeat._beat_behind(time.monotonic() + 0.2)
        assert heartbeat._behind == [second]
        assert column("heartbeat_at", [second]) == [None]
        release()
        heartbeat._beat_behind(time.monotonic() + 5)
    assert heartbeat._behind == []
    assert None not in column("heartbeat_at", [first, second])


def test_a_mark_skips_a_row_another_session_holds_and_writes_it_at_the_next_beat(
    register_workflow: Any,
) -> None:
    first, second = claimed_pair(register_workflow)
    DeferredWork.objects.update(started_at=None)
    heartbeat = heartbeat_of([first, second])
    heartbeat.ledger.take_now(SYNC, 2)  # both started: their marks are wanted
    with row_locked(DeferredWork, second.id):
        began = time.monotonic()
        heartbeat._mark_started()
        assert time.monotonic() - began < 5
        marked, skipped = column("started_at", [first, second])
        assert marked is not None
        assert skipped is None
        assert heartbeat.ledger.unmarked() == [second]
    heartbeat._turn(0.0)  # the next beat marks what a mark skipped
    assert heartbeat.ledger.unmarked() == []
    assert None not in column("started_at", [first, second])


def test_a_claim_lost_meanwhile_is_not_confirmed_by_the_waiting_beat(register_workflow: Any) -> None:
    """A row the beat skipped and another runner then took (its claim token changed): the
    beat that waited for it matches nothing and confirms nothing, so the queued claim is
    never started as if it were still ours."""
    first, second = claimed_pair(register_workflow)
    heartbeat = heartbeat_of([first, second])
    confirmed_before = heartbeat.ledger._confirmed[second.key]
    with row_locked(DeferredWork, second.id) as release:
        heartbeat._turn(0.0)
        assert heartbeat._behind == [second]
        release()
    DeferredWork.objects.filter(pk=second.id).update(claim_token="another-runners-claim")
    heartbeat._beat_behind(time.monotonic() + 5)
    assert heartbeat._behind == []
    assert heartbeat.ledger._confirmed[second.key] == confirmed_before
    assert heartbeat.ledger._confirmed[first.key] > confirmed_before

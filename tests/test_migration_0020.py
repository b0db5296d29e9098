"""Migration 0020: an ended attempt of a limited kind notifies ``"ended <kind>"``, the same
payload for every row of the kind, so one statement (or transaction) that ends or releases
N rows of a kind a runner rests sends one NOTIFY per kind, not N. Reversed, the function
is 0019's again (``"<id> <kind>"`` per row)."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_workflows import enqueue_many
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.deferred.wakeup import CHANNEL
from nexus_workflows.sql import postgresql
from tests.migrating import migrate
from tests.raw_connections import raw_connection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

BEFORE = "0019_notify_attempt_ended_while_full"
ROWS = 6


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def ended_payloads(kinds: list[str], works: list[ClaimedWork]) -> list[str]:
    """End ``works`` (one statement per kind's claim) while another session holds
    the ending lock of each of ``kinds`` (a runner resting them): the payloads sent."""
    with raw_connection() as listener, raw_connection() as sender, raw_connection() as resting:
        postgresql.listen(listener, CHANNEL)
        for kind in kinds:
            postgresql.hold_rest_lock(resting, kind, lock_timeout=5, lock_class=postgresql.ENDING_LOCK_CLASS)
        transitions.finish_done(works)
        sender.execute("SELECT pg_notify(%s, 'marker')", [CHANNEL])
        payloads = []
        for notification in listener.notifies(timeout=5):
            payloads.append(notification.payload)
            if notification.payload == "marker":  # sent after the ends committed: all came
                break
    return payloads


@pytest.fixture
def claimed(register_workflow: Any) -> tuple[list[str], list[ClaimedWork]]:
    """Two limited kinds, ROWS attempts of them running on one runner."""
    kinds = [register_workflow(noop, retry_schedule=[1], concurrency=ROWS).kind for _ in range(2)]
    for kind in kinds:
        enqueue_many(kind, [{"key": n} for n in range(ROWS // 2)])
    works = Claimer(kinds=kinds, using="default").claim_due(ROWS)
    assert len(works) == ROWS
    return kinds, works


def test_an_update_ending_many_rows_of_a_rested_kind_notifies_once_per_kind(
    claimed: tuple[list[str], list[ClaimedWork]],
) -> None:
    kinds, works = claimed
    assert sorted(ended_payloads(kinds, works)) == sorted([f"ended {kind}" for kind in kinds] + ["marker"])


def test_reversed_each_ended_row_is_named_again(claimed: tuple[list[str], list[ClaimedWork]]) -> None:
    kinds, works = claimed
    migrate(BEFORE)
    try:
        payloads = ended_payloads(kinds, works)
    finally:
        migrate(None)
    assert sorted(payloads) == sorted([f"{work.id} {work.kind}" for work in works] + ["marker"])

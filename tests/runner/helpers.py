"""In-memory parts for the runner's unit tier: claimed work that never touched a database."""

from __future__ import annotations

import itertools
from typing import Any

from nexus_workflows.deferred.execution import Outcome, Result
from nexus_workflows.deferred.runner.capacity import Capacity
from nexus_workflows.deferred.runner.lanes import LaneClaims, lane_of
from nexus_workflows.deferred.runner.ledger import ASYNC, SYNC, Ledger
from nexus_workflows.deferred.transitions import ClaimedWork

_ids = itertools.count(1)


def work(token: str = "t1", **fields: Any) -> ClaimedWork:
    """A claimed row as the claim would return it (no database involved)."""
    values: dict[str, Any] = {
        "id": next(_ids),
        "kind": "unit",
        "dedupe_key": "",
        "trigger": {},
        "checkpoints": {},
        "attempt": 0,
        "history": [],
        "claim_token": token,
    }
    values.update(fields)
    return ClaimedWork(**values)


def outcome(result: Result = Result.SUCCEEDED, token: str = "t1", **fields: Any) -> Outcome:
    error = None if result is Result.SUCCEEDED else RuntimeError("boom")
    return Outcome(work(token, **fields), result, error)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def lane_claims(*, kinds: list[str], queues: list[str] | None) -> tuple[LaneClaims, list[ClaimedWork]]:
    """A runner's lane claims on the default database (4 slots a lane), and the list the
    works they claim are handed to."""
    handed_out: list[ClaimedWork] = []
    lanes = LaneClaims(
        kinds=kinds,
        queues=queues,
        using="default",
        worker_id="w",
        ledger=Ledger(lane_of),
        capacity={SYNC: Capacity(4, 10), ASYNC: Capacity(4, 10)},
        claimed=handed_out.extend,
        reclaimed=handed_out.extend,
    )
    return lanes, handed_out

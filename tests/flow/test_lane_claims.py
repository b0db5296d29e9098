"""A lane's claims of limited kinds while it holds a prefetch of plain work, in one
process on the database: limited rows are claimed (due and stale) as far as the lane can
start them about at once, and plain rows wait for the lane's next refill."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from nexus_workflows import enqueue_many
from nexus_workflows.deferred.runner.capacity import Capacity
from nexus_workflows.deferred.runner.lanes import LaneClaims, lane_of
from nexus_workflows.deferred.runner.ledger import ASYNC, SYNC, Ledger
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.models import DeferredWork, Status
from tests.runner.helpers import work

pytestmark = pytest.mark.django_db(transaction=True)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


class BusyLane:
    """LaneClaims of ``kinds`` over a sync lane of four slots, each running a quick plain
    attempt (1 ms on average), with 20 more queued: the lane wants no more work."""

    def __init__(self, kinds: list[str], *, average_runtime: float = 0.001) -> None:
        self.handed_out: list[ClaimedWork] = []
        self.reclaimed: list[ClaimedWork] = []
        self.ledger = Ledger(lane_of)
        sync = Capacity(4, 10)
        sync.observe(average_runtime)
        self.lanes = LaneClaims(
            kinds=kinds,
            queues=[],
            using="default",
            worker_id="w",
            ledger=self.ledger,
            # The async lane's slots are free: they are no room for sync work.
            capacity={SYNC: sync, ASYNC: Capacity(100, 10)},
            claimed=self.claimed,
            reclaimed=self.reclaimed.extend,
        )
        self.ledger.dispatch([work(kind="prefetched") for _ in range(24)])
        self.ledger.take_now(SYNC, 4)
        assert not self.lanes.wants_more(SYNC)

    def claimed(self, works: list[ClaimedWork]) -> None:
        """As the runner does: queue them for the workers."""
        self.handed_out.extend(works)
        self.ledger.dispatch(works)


def test_a_lane_full_of_quick_plain_work_still_claims_limited_work_it_can_start(
    register_workflow: Any,
) -> None:
    limited = register_workflow(noop, retry_schedule=[1], rate_limit=(100, 60)).kind
    plain = register_workflow(noop, retry_schedule=[1]).kind
    enqueue_many(limited, [{"key": n} for n in range(10)])
    enqueue_many(plain, [{"key": n} for n in range(10)])
    busy = BusyLane([limited, plain])
    claimed, more, _ = busy.lanes.claim_due(None)
    # Four: one per slot (each ends its quick attempt within moments); no plain rows.
    assert (claimed, more) == (4, False)
    assert {item.kind for item in busy.handed_out} == {limited}
    assert all(item.limited for item in busy.handed_out)
    assert DeferredWork.objects.filter(kind=plain, status=Status.PROCESSING).count() == 0
    # They are next for the workers, ahead of the 20 plain items queued before them.
    assert [item.kind for item in busy.ledger.take_now(SYNC, 5)] == [limited] * 4 + ["prefetched"]
    # Every slot now runs or is promised limited work: nothing more until one ends.
    assert busy.lanes.claim_due(None)[0] == 0


def test_a_lane_full_of_slow_plain_work_claims_no_limited_work(register_workflow: Any) -> None:
    limited = register_workflow(noop, retry_schedule=[1], rate_limit=(100, 60)).kind
    enqueue_many(limited, [{"key": n} for n in range(10)])
    busy = BusyLane([limited], average_runtime=5.0)
    assert busy.lanes.claim_due(None)[0] == 0
    assert DeferredWork.objects.filter(kind=limited, status=Status.PROCESSING).count() == 0


def test_stale_limited_work_is_reclaimed_as_far_as_its_own_lane_can_start_it(
    register_workflow: Any,
) -> None:
    limited = register_workflow(noop, retry_schedule=[1, 1], rate_limit=(100, 60)).kind
    enqueue_many(limited, [{"key": n} for n in range(10)])
    DeferredWork.objects.update(
        status=Status.PROCESSING, claim_token="dead-runner", heartbeat_at=Now() - timedelta(hours=1)
    )
    slow = BusyLane([limited], average_runtime=5.0)
    # Slow work fills every sync slot; the async lane's 100 free slots do not count.
    assert slow.lanes.claim_stale_limited(timedelta(minutes=5), None) == 0
    quick = BusyLane([limited])
    assert quick.lanes.claim_stale_limited(timedelta(minutes=5), None) == 4
    assert len(quick.reclaimed) == 4
    assert all(item.limited and item.reclaimed for item in quick.reclaimed)

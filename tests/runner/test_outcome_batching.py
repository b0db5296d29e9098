"""How finished attempts' outcomes are grouped into writes, and retried."""

from __future__ import annotations

from nexus_workflows.deferred.execution import Result
from nexus_workflows.deferred.runner.ledger import Ledger, Pending
from nexus_workflows.deferred.runner.outcomes import (
    WRITE_RETRY_MAX_DELAY,
    batches,
    released_for_outage,
    retry_delay,
)
from nexus_workflows.deferred.runner.unavailable import DATABASE_UNAVAILABLE
from tests.runner.helpers import outcome, work


def test_successes_of_one_claim_are_one_write_and_failures_are_written_alone() -> None:
    a1, a2, b1 = (Pending(outcome(token=token)) for token in ("a", "a", "b"))
    f1, f2 = Pending(outcome(Result.FAILED, token="a")), Pending(outcome(Result.CLAIM_LOST, token="b"))
    assert batches([a1, f1, b1, a2, f2]) == [[f1], [f2], [a1, a2], [b1]]
    assert batches([]) == []


def test_a_failing_write_is_retried_later_and_later() -> None:
    assert [retry_delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert retry_delay(30) == WRITE_RETRY_MAX_DELAY


def test_only_outcomes_whose_time_has_come_are_due() -> None:
    ledger = Ledger()
    now_, later = Pending(outcome(), retry_at=10.0), Pending(outcome(), failures=1, retry_at=20.0)
    ledger.add_unwritten(now_)
    ledger.add_unwritten(later)
    assert ledger.due_unwritten(15.0) == [now_]
    assert ledger.next_retry() == 20.0
    ledger.written([now_])
    assert ledger.unwritten_count() == 1
    assert ledger.held() == [later.outcome.work]  # still heart-beaten until written


def test_an_outage_failure_is_released_at_most_five_times_per_attempt() -> None:
    outage = DATABASE_UNAVAILABLE[0]("server closed the connection")
    released = {"outcome": "released", "reason": "database unavailable", "attempt": 2}
    assert released_for_outage(work(attempt=2, history=[released] * 4), outage)
    assert not released_for_outage(work(attempt=2, history=[released] * 5), outage)
    # Releases of earlier attempts do not count; other errors are never released.
    assert released_for_outage(work(attempt=3, history=[released] * 5), outage)
    assert not released_for_outage(work(attempt=2), RuntimeError("boom"))

"""How finished attempts' outcomes are grouped into writes, and retried."""

from __future__ import annotations

import sys
from typing import Any, cast

from nexus_workflows.deferred.execution import Result
from nexus_workflows.deferred.runner.ledger import Ledger, Pending
from nexus_workflows.deferred.runner.outcomes import (
    WRITE_RETRY_MAX_DELAY,
    OutcomeWriter,
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


def test_a_failed_batch_is_written_item_by_item_outside_its_error() -> None:
    """Written items send task_finished; its receivers (Django 6's logger) must not see
    the batch's error, whose message may quote another item's data, as being handled."""
    ledger = Ledger()
    good, bad = Pending(outcome()), Pending(outcome())
    for pending in (good, bad):
        ledger.add_unwritten(pending)
    handled_while_writing: list[tuple[int, Any]] = []

    def write(batch: list[Pending]) -> None:
        handled_while_writing.append((len(batch), sys.exc_info()[0]))
        if len(batch) > 1 or batch[0] is bad:
            raise ValueError("value too long for the column")

    writer = OutcomeWriter(ledger, cast(Any, None), observe=lambda outcome: None)
    writer._write_batch([good, bad], write)
    assert handled_while_writing == [(2, None), (1, None), (1, None)]
    assert (ledger.due_unwritten(float("inf")), bad.failures, good.failures) == ([bad], 1, 0)

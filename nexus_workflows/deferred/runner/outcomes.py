"""Writing finished attempts' outcomes: successes of one claim batched, failures one by one."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from queue import Empty, SimpleQueue

from nexus_workflows.database_errors import blames_the_statement, statement_refused
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.execution import Outcome, Result
from nexus_workflows.deferred.history import describe_error
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.runner.ledger import Ledger, Pending
from nexus_workflows.deferred.runner.logs import attempt_of, log_write_error
from nexus_workflows.deferred.runner.stats import Tally
from nexus_workflows.deferred.runner.unavailable import is_database_unavailable
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.exceptions import OutcomeNotStored, is_permanent
from nexus_workflows.flow.starts import ReservedStartLapsed
from nexus_workflows.limits import OUTAGE_RELEASES_MAX
from nexus_workflows.tasks import running as tasks_running
from nexus_workflows.tasks.running import error_record

# An attempt that failed because the database was unreachable runs again this soon.
OUTAGE_RETRY_DELAY = timedelta(seconds=1)
WRITE_RETRY_DELAY = 0.5
WRITE_RETRY_MAX_DELAY = 60.0
# After this many failed writes of one failure outcome, its error text is replaced by
# the exception type alone: a message the database rejects must not pin the item.
PLAIN_ERROR_AFTER = 2
# After this many refused writes of a success (not an outage, nor a lock wait cut short,
# a deadlock or a cancel: a project's trigger or constraint refuses it, a value the
# database will not store), a failure is written in
# its place (OutcomeNotStored: the write's error type only, never the value).
SUCCESS_WRITES_MAX = 4
# After this many refused writes of a failure outcome, the runner stops holding the item:
# nothing it could write was taken, so its claim goes stale and a reclaim decides.
FAILURE_WRITES_MAX = 4


def batches(due: list[Pending]) -> list[list[Pending]]:
    """How ``due`` outcomes are written: each failure alone (its own transition), then
    the successes grouped by claim token (one statement per claim)."""
    failures: list[list[Pending]] = []
    successes: dict[str, list[Pending]] = {}
    for pending in due:
        if pending.outcome.result is Result.SUCCEEDED:
            successes.setdefault(pending.outcome.work.claim_token, []).append(pending)
        else:
            failures.append([pending])
    return [*failures, *successes.values()]


def retry_delay(failures: int) -> float:
    """Seconds before an outcome whose write failed ``failures`` times is tried again."""
    return min(WRITE_RETRY_DELAY * 2 ** (failures - 1), WRITE_RETRY_MAX_DELAY)


def released_for_outage(work: ClaimedWork, error: BaseException) -> bool:
    """Whether a failure only says the database was unreachable, and this attempt has not
    been released for that too often already (a workflow that always fails so must still
    walk its schedule and end)."""
    if not is_database_unavailable(error) or blames_the_statement(error):
        return False
    releases = sum(
        1
        for entry in work.history
        if isinstance(entry, dict)
        and entry.get("outcome") == "released"
        and entry.get("reason") == "database unavailable"
        and entry.get("attempt") == work.attempt
    )
    return releases < OUTAGE_RELEASES_MAX


class OutcomeWriter:
    """Writes, from the main thread, the outcomes the ledger holds unwritten (an attempt's
    end puts its outcome there: :meth:`Ledger.finished`); :meth:`put` (any thread) hands
    it over for ``observe`` too.

    :meth:`write` raises a database outage (what is not written stays in the ledger,
    held and heart-beaten); any other error is contained to its item: logged by kind, id
    and exception type, and retried with a growing delay while the others are written.
    """

    def __init__(self, ledger: Ledger, tally: Tally, observe: Callable[[Outcome], None]) -> None:
        self.ledger = ledger
        self.tally = tally
        self.observe = observe  # each outcome's duration, for the claim sizing
        self._arrived: SimpleQueue[Outcome] = SimpleQueue()

    def put(self, outcome: Outcome) -> None:
        """Hand over a finished attempt's outcome, already in the ledger, for ``observe``
        (thread-safe, never blocks)."""
        self._arrived.put(outcome)

    def write(self) -> None:
        """Write every outcome whose time has come; raises a database outage."""
        self._collect()
        for batch in batches(self.ledger.due_unwritten(time.monotonic())):
            # Each batch leaves the ledger as soon as it is written, so an outage
            # half-way never writes one twice.
            if batch[0].outcome.result is Result.SUCCEEDED:
                self._write_batch(batch, self._write_successes)
            else:
                self._write_batch(batch, self._write_failure)
        self.tally.observer.outcomes_written()

    def _collect(self) -> None:
        while True:
            try:
                outcome = self._arrived.get_nowait()
            except Empty:
                return
            self.observe(outcome)

    def _write_batch(self, batch: list[Pending], write: Callable[[list[Pending]], None]) -> None:
        try:
            write(batch)
        except Exception as error:  # contained to this item, unless it is an outage
            if is_database_unavailable(error):
                raise  # down or read-only: nothing is this batch's fault; the loop waits
            failed = error
        else:
            self.ledger.written(batch)
            return
        # Outside the except block: the items written below send task_finished, whose
        # receivers (Django 6's logger among them) would see this batch's error, another
        # item's data in its message, as the exception being handled.
        if len(batch) > 1:  # one item's row may be the cause: write each on its own
            for pending in batch:
                self._write_batch([pending], write)
            return
        (pending,) = batch
        pending.failures += 1
        pending.retry_at = time.monotonic() + retry_delay(pending.failures)
        log_write_error(pending.outcome.work, "outcome", failed)
        if statement_refused(failed) is not None:
            return  # a lock wait cut short, a deadlock, a cancel: it passes later, as after an outage
        pending.refusals += 1
        if pending.outcome.result is Result.SUCCEEDED:
            if pending.refusals >= SUCCESS_WRITES_MAX:
                self._fail_instead(pending, failed)
        elif pending.refusals >= FAILURE_WRITES_MAX:
            self._give_up(pending, failed)

    def _fail_instead(self, pending: Pending, failed: Exception) -> None:
        """Write a failure in place of a success the database keeps refusing (next turn)."""
        work = pending.outcome.work
        error = OutcomeNotStored(
            f"the attempt succeeded, but the database refused to store its outcome "
            f"({type(failed).__name__}); its result was dropped"
        )
        work.return_value = None
        if work.is_task:
            work.error_record = error_record(error)
        pending.outcome = replace(pending.outcome, result=Result.FAILED, error=error)
        pending.failures = pending.refusals = 0
        pending.retry_at = 0.0

    def _give_up(self, pending: Pending, failed: Exception) -> None:
        """Stop holding an item no write of its outcome gets into the database: it is no
        longer heart-beaten (its claim goes stale, for a reclaim), and no longer counts
        against its lane (``--once`` ends, and exits non-zero)."""
        self.ledger.written([pending])
        self.tally.not_written(pending.outcome.work, failed)

    def _write_successes(self, batch: list[Pending]) -> None:
        written, lost = transitions.finish_done(pending.outcome.work for pending in batch)
        for work in written:
            self.tally.finished(work, "done", "done", logging.INFO)
        tasks_running.send_finished(written, succeeded=True)
        for work in lost:
            self.tally.lost(work)

    def _write_failure(self, batch: list[Pending]) -> None:
        (pending,) = batch
        outcome = pending.outcome
        work = outcome.work
        if outcome.result is Result.CLAIM_LOST:
            self.tally.lost(work)
            return
        assert outcome.error is not None
        error_type = type(outcome.error).__name__
        error = describe_error(outcome.error)
        if pending.failures >= PLAIN_ERROR_AFTER:
            error = f"{error_type}: (the message could not be stored)"
        if isinstance(outcome.error, ReservedStartLapsed):
            # prepare never ran (its start waited too long in this runner): no attempt.
            self._release(work, error, error_type, "reserved start lapsed", timedelta(0))
            return
        permanent = is_permanent(outcome.error)
        if not permanent and released_for_outage(work, outcome.error):
            self._release(work, error, error_type, "database unavailable", OUTAGE_RETRY_DELAY)
            return
        delay = None if permanent else registry.for_work(work).delay_after(work.attempt)
        if delay is None:
            self._abandon(
                work, error, error_type, "permanent error" if permanent else "retry schedule exhausted"
            )
        elif transitions.reschedule(work, delay=delay, error=error):
            line = (
                f"failed ({error_type}); {attempt_of(work, work.attempt + 1)} in {delay.total_seconds():g}s"
            )
            self.tally.finished(work, "rescheduled", line, logging.WARNING)
        else:
            self.tally.lost(work)

    def _release(self, work: ClaimedWork, error: str, error_type: str, reason: str, delay: timedelta) -> None:
        if transitions.release_attempt(work, delay=delay, reason=reason, error=error):
            line = f"failed ({error_type}: {reason}); released, attempt unchanged"
            self.tally.finished(work, "released", line, logging.WARNING)
        else:
            self.tally.lost(work)

    def _abandon(self, work: ClaimedWork, error: str, error_type: str, reason: str) -> None:
        if transitions.abandon(work, error=error, reason=reason):
            self.tally.finished(
                work, "abandoned", f"failed ({error_type}); abandoned: {reason}", logging.ERROR
            )
            tasks_running.send_finished([work], succeeded=False)
        else:
            self.tally.lost(work)

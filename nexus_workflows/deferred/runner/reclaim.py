"""The crash-loop guard of reclaimed work."""

from __future__ import annotations

import logging
from collections.abc import Callable

from nexus_workflows.database_errors import statement_refused
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.runner.ledger import Ledger
from nexus_workflows.deferred.runner.logs import log_outcome, log_write_error
from nexus_workflows.deferred.runner.outcomes import retry_delay
from nexus_workflows.deferred.runner.stats import Tally
from nexus_workflows.deferred.runner.unavailable import is_database_unavailable
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.flow import starts
from nexus_workflows.limits import UNSTARTED_LOSSES_MAX
from nexus_workflows.tasks import running as tasks_running

# After this many refused guard writes of one reclaimed item it is given up (as outcomes
# are: see :data:`.outcomes.FAILURE_WRITES_MAX`), so it is not retried at every turn for ever.
GUARD_WRITES_MAX = 4


def guard_crash_loop(work: ClaimedWork, tally: Tally) -> bool:
    """Whether reclaimed ``work`` may run again: unless its lost attempts used up the
    schedule (or its claims were lost before starting too often), in which case it is
    abandoned. The lost attempt is in the history before the work runs again."""
    workflow = registry.for_work(work)
    if work.attempt < workflow.max_attempts and work.lost_unstarted < UNSTARTED_LOSSES_MAX:
        if not transitions.record_lost(work):
            # Another claim holds it now (its runner finished it, or reclaimed it first):
            # this claim's reserved start would hold its window row for nothing.
            starts.give_back([work])
            tally.lost(work)
            return False
        log_outcome(work, "reclaimed from a runner that stopped heart-beating", logging.WARNING)
        return True
    if work.attempt >= workflow.max_attempts:
        error = (
            f"WorkerLost: the runner of attempt {work.attempt} stopped heart-beating and "
            f"the retry schedule allows {workflow.max_attempts} attempts"
        )
    else:
        error = (
            f"WorkerLost: {work.lost_unstarted} claims of this work were lost before their "
            f"attempt started; at most {UNSTARTED_LOSSES_MAX} are allowed"
        )
    if transitions.abandon(work, error=error, reason="lost too many times", unrun=True):
        tally.finished(work, "abandoned", "abandoned (its runners kept dying)", logging.ERROR)
        tasks_running.send_finished([work], succeeded=False)
    else:
        tally.lost(work)
    return False


def guard_unguarded(ledger: Ledger, tally: Tally, dispatch: Callable[[list[ClaimedWork]], None]) -> int:
    """Run the crash-loop guard on the ledger's reclaimed work and ``dispatch`` what may run;
    returns how many. An item whose guard write fails stays held (and heart-beaten) and
    is tried again after a growing delay, as outcome writes are (0.5 s, 1 s, 2 s …); it
    never takes the batch's other claims with it. A
    database outage is raised after keeping the rest. After :data:`GUARD_WRITES_MAX`
    refusals (not a lock wait cut short, a deadlock or a cancel, which pass later: a
    project's trigger, a value the database will not store) the item is given up, as an
    outcome no write gets in is: no longer held, its claim goes stale."""
    works = ledger.take_unguarded(ledger.clock())
    runnable: list[ClaimedWork] = []
    retry: list[ClaimedWork] = []
    for number, work in enumerate(works):
        try:
            if guard_crash_loop(work, tally):
                runnable.append(work)
        except Exception as error:  # contained to this item, unless it is an outage
            if is_database_unavailable(error):  # down or read-only: the loop waits
                ledger.add_unguarded([*retry, *works[number:]])
                dispatch(runnable)
                raise
            if not _refused_for_good(ledger, tally, work, error):
                retry.append(work)
        else:
            ledger.guard_settled(work)
    ledger.add_unguarded(retry)
    dispatch(runnable)
    return len(runnable)


def _refused_for_good(ledger: Ledger, tally: Tally, work: ClaimedWork, error: Exception) -> bool:
    """Count a failed guard write of ``work`` (tried again later, with the outcomes'
    back-off); whether it is given up now (said once)."""
    refused = statement_refused(error) is None
    if ledger.guard_failed(work, retry_delay, refused=refused) >= GUARD_WRITES_MAX:
        ledger.guard_settled(work)
        tally.guard_not_written(work, error)
        return True
    log_write_error(work, "reclaim", error)
    return False

"""The runner's log lines: kind, id, attempt and outcome only, never trigger or error text
(they may carry patient data and stay in the database)."""

from __future__ import annotations

import logging

from nexus_workflows.deferred.attempts import (
    attempt_number,
    attempt_text,
    describe_attempt,
    max_attempts,
    number_of,
)
from nexus_workflows.deferred.transitions import ClaimedWork

# One logger for every part: the projects' formatters name it.
logger = logging.getLogger("nexus_workflows.deferred.runner")


def attempt_of(work: ClaimedWork, attempt: int | None = None) -> str:
    """``"attempt 2 of 3"`` for ``work`` (its current attempt unless another is given),
    a Django task's counted against its task's schedule, as the CLI and the admin do."""
    return describe_attempt(work.kind, work.attempt if attempt is None else attempt, work.backend_name)


def log_outcome(work: ClaimedWork, outcome: str, level: int) -> None:
    """One line about one attempt of ``work``."""
    if not logger.isEnabledFor(level):  # -v 0, or a project's WARNING: nothing to build
        return
    # The runs allowed looked up once for the text and the number: two lines per item.
    allowed = max_attempts(work.kind, work.backend_name)
    number = number_of(work.attempt, allowed)
    logger.log(
        level,
        "%s #%s %s: %s",
        work.kind,
        work.id,
        attempt_text(number, allowed),
        outcome,
        extra={"workflow_kind": work.kind, "work_id": work.id, "attempt": number, "outcome": outcome},
    )


def log_write_error(work: ClaimedWork, what: str, error: BaseException) -> None:
    """A write about ``work`` failed; by exception type only (its message may echo data)."""
    logger.error(
        "%s #%s %s: writing its %s failed (%s); it stays held and is tried again",
        work.kind,
        work.id,
        attempt_of(work),
        what,
        type(error).__name__,
        extra={
            "workflow_kind": work.kind,
            "work_id": work.id,
            "attempt": attempt_number(work.kind, work.attempt, work.backend_name),
        },
    )

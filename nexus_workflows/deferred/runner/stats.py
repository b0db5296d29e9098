"""What a runner did, counted, and the bookkeeping every outcome shares."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

from nexus_workflows.deferred.runner.logs import log_outcome
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.observability.observer import Observer


@dataclass
class RunStats:
    done: int = 0
    rescheduled: int = 0
    abandoned: int = 0
    reclaimed: int = 0
    released: int = 0
    lost: int = 0
    purged: int = 0
    # Queued claims never started: heartbeats failed too long (Ledger, "forfeited").
    forfeited: int = 0
    # Finished attempts whose outcome the database kept refusing (not an outage): given
    # up, their claims left to go stale (outcomes.FAILURE_WRITES_MAX).
    unwritten: int = 0
    # Reclaimed items whose crash-loop guard write (their lost attempt's history) the
    # database kept refusing: given up likewise (reclaim.GUARD_WRITES_MAX).
    unwritten_guards: int = 0

    def summary(self) -> str:
        return (
            f"{self.done} done, {self.rescheduled} rescheduled, {self.abandoned} abandoned, "
            f"{self.reclaimed} reclaimed"
            + (f", {self.lost} lost" if self.lost else "")
            + (f", {self.released} released" if self.released else "")
            + (f", {self.purged} purged" if self.purged else "")
            + (f", {self.forfeited} forfeited" if self.forfeited else "")
            + (f", {self.unwritten} unwritten" if self.unwritten else "")
            + (f", {self.unwritten_guards} unwritten guard(s)" if self.unwritten_guards else "")
        )

    def given_up(self) -> str:
        """What the database kept refusing and was given up, counted by what it was
        ("1 outcome(s) and 2 crash-loop guard write(s)"); empty when nothing was. Counts
        only: the items are named in the runner's ERROR lines (kind and id)."""
        parts = []
        if self.unwritten:
            parts.append(f"{self.unwritten} outcome(s)")
        if self.unwritten_guards:
            parts.append(
                f"{self.unwritten_guards} crash-loop guard write(s) (a reclaimed item's lost attempt)"
            )
        return " and ".join(parts)

    def as_dict(self) -> dict[str, int]:
        return {field.name: getattr(self, field.name) for field in fields(self)}


class Tally:
    """Counts, observes and logs each written outcome in one call."""

    def __init__(self, stats: RunStats, observer: Observer) -> None:
        self.stats = stats
        self.observer = observer

    def finished(self, work: ClaimedWork, counter: str, line: str, level: int) -> None:
        """``work`` ended as ``counter`` (a :class:`RunStats` field): count, observe, log."""
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        self.observer.finished(work, counter)
        log_outcome(work, line, level)

    def not_written(self, work: ClaimedWork, error: BaseException) -> None:
        """No write of the outcome of ``work`` was taken (``error`` the last one's):
        counted and logged once, at ERROR."""
        self.stats.unwritten += 1
        self._given_up(work, error, "outcome")

    def guard_not_written(self, work: ClaimedWork, error: BaseException) -> None:
        """No write of the crash-loop guard of reclaimed ``work`` was taken: counted apart
        from outcomes (no attempt of it ran here) and logged once."""
        self.stats.unwritten_guards += 1
        self._given_up(work, error, "reclaim (its lost attempt)")

    def _given_up(self, work: ClaimedWork, error: BaseException, what: str) -> None:
        # By type only: the error's text may echo the row.
        log_outcome(
            work,
            f"its {what} could not be written ({type(error).__name__}, not an outage); no longer "
            "held: its claim goes stale and is reclaimed after STALE_AFTER",
            logging.ERROR,
        )

    def lost(self, work: ClaimedWork) -> None:
        """The claim of ``work`` was taken over: nothing of this attempt is written."""
        self.finished(
            work,
            "lost",
            "claim lost; result discarded (another runner or an operator took over)",
            logging.WARNING,
        )

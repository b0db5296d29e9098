"""Running one attempt of deferred work: ``prepare(trigger, checkpoints, save)``."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from .claims import ClaimedWork, save_checkpoints
from .exceptions import ClaimLost
from .flow import starts
from .registry import Workflow


class Result(enum.Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CLAIM_LOST = "claim lost"


@dataclass
class Outcome:
    work: ClaimedWork
    result: Result
    error: BaseException | None = None
    duration: float = 0.0


def execute(workflow: Workflow, work: ClaimedWork) -> Outcome:
    """Run the attempt and report how it ended; never raises.

    ``save(patch)`` merges ``patch`` into the checkpoint journal, durably and fenced by
    the claim, before it returns (and updates the ``checkpoints`` dict that ``prepare``
    was given). For an ``async def`` prepare, ``save`` is a coroutine function.
    """
    checkpoints = dict(work.checkpoints)

    def save(patch: dict[str, Any]) -> None:
        checkpoints.update(save_checkpoints(work, patch))

    started = time.perf_counter()
    try:
        # A rate-limited kind's attempt starts here, in its window (the claim reserved it).
        starts.begin(work)
        if workflow.runs_task:
            workflow.run_task(work)  # type: ignore[attr-defined]
        elif workflow.is_async:
            workflow.call_prepare(work.trigger, checkpoints, sync_to_async(save, thread_sensitive=True))
        else:
            workflow.call_prepare(work.trigger, checkpoints, save)
    except ClaimLost as error:
        return Outcome(work, Result.CLAIM_LOST, error, time.perf_counter() - started)
    except BaseException as error:  # noqa: BLE001 - consumer code may raise anything
        return Outcome(work, Result.FAILED, error, time.perf_counter() - started)
    finally:
        # prepare began before this: its window start counts from now at the latest.
        starts.confirm([work])
    return Outcome(work, Result.SUCCEEDED, None, time.perf_counter() - started)

"""Running one attempt of deferred work: ``prepare(trigger, checkpoints, save)``."""

from __future__ import annotations

import asyncio
import enum
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from nexus_workflows.deferred.registry import Workflow
from nexus_workflows.deferred.transitions import ClaimedWork, save_checkpoints
from nexus_workflows.exceptions import ClaimLost
from nexus_workflows.flow import starts

#: Writes a patch of one attempt's journal durably and fenced; returns the clean patch.
SavePatch = Callable[[ClaimedWork, Any], dict[str, Any]]
AsyncSavePatch = Callable[[ClaimedWork, Any], Awaitable[dict[str, Any]]]
#: Runs a function with the database, off the loop: ``await run_db(function, *args)``.
RunDb = Callable[..., Awaitable[Any]]


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


def execute(workflow: Workflow, work: ClaimedWork, save_patch: SavePatch = save_checkpoints) -> Outcome:
    """Run the attempt in this thread and report how it ended; never raises.

    ``save(patch)`` merges ``patch`` into the checkpoint journal, durably and fenced by
    the claim, before it returns (and updates the ``checkpoints`` dict that ``prepare``
    was given); ``save_patch`` writes it (by default on this thread's connection). For an
    ``async def`` prepare run here, ``save`` is a coroutine function; a runner runs those
    on its event loop instead (:func:`execute_async`).
    """
    checkpoints = dict(work.checkpoints)
    # One save at a time: each writes the whole journal merged with its patch, so two at
    # once (threads of one prepare) would each drop the other's patch.
    one_at_a_time = threading.Lock()

    def save(patch: dict[str, Any]) -> None:
        with one_at_a_time:
            checkpoints.update(save_patch(work, patch))

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


class _AsyncSaves:
    """The ``save`` of an ``async def`` attempt: one at a time, each writing the whole
    journal merged with its patch (two at once, ``asyncio.gather`` of two saves, would
    each drop the other's patch).

    A save's turn ends when its write does, not when its caller stops waiting: a save
    cancelled while queued (``asyncio.timeout`` around it) is still written, and a later
    save written before it, or merged without its patch, would lose a patch.
    """

    def __init__(self, work: ClaimedWork, checkpoints: dict[str, Any], save_patch: AsyncSavePatch) -> None:
        self.work = work
        self.checkpoints = checkpoints
        self.save_patch = save_patch
        self.turn = asyncio.Lock()
        # A task among them (a save after the runner stopped) is weakly referenced by its loop.
        self.writing: set[asyncio.Future[dict[str, Any]]] = set()

    async def save(self, patch: dict[str, Any]) -> None:
        await self.turn.acquire()
        try:
            write = asyncio.ensure_future(self.save_patch(self.work, patch))
        except BaseException:
            self.turn.release()  # the patch was refused: nothing is written
            raise
        self.writing.add(write)
        write.add_done_callback(self._written)
        # Cancelling the caller leaves the write going (it holds the turn until it ends):
        # the prepare's timeout is kept, the journal's order too.
        await asyncio.shield(write)

    def _written(self, write: asyncio.Future[dict[str, Any]]) -> None:
        self.writing.discard(write)
        self.turn.release()
        # exception() also marks a cancelled save's error as seen (it is nobody's now).
        if not write.cancelled() and write.exception() is None:
            self.checkpoints.update(write.result())

    async def settled(self) -> None:
        """Once no write of this attempt is under way (a save its caller gave up on)."""
        async with self.turn:
            pass


async def execute_async(
    workflow: Workflow, work: ClaimedWork, save_patch: AsyncSavePatch, run_db: RunDb = asyncio.to_thread
) -> Outcome:
    """Run the attempt of an ``async def`` prepare on the running loop; never raises
    but ``CancelledError`` (the attempt's task was cancelled).

    ``await save(patch)`` is written by ``save_patch`` (the runner's journal writer),
    durably and fenced, before it returns; it raises :class:`ClaimLost` when the claim
    is no longer ours. A save whose caller is cancelled (``asyncio.timeout`` around it)
    raises ``CancelledError`` at once, and its write goes on: the attempt's next save,
    and its end, wait for that write, so saves are written in the order they were made
    and a later one keeps the cancelled one's patch if it was written. A rate-limited
    kind's start and its confirmation run through ``run_db`` (the runner's: on a journal
    writer's connection).
    """
    checkpoints = dict(work.checkpoints)
    saves = _AsyncSaves(work, checkpoints, save_patch)
    started = time.perf_counter()
    try:
        if work.reservation is not None:
            # A rate-limited kind's start (a few statements) off the loop.
            await run_db(starts.begin, work)
        await workflow.prepare(work.trigger, checkpoints, saves.save)
    except ClaimLost as error:
        return Outcome(work, Result.CLAIM_LOST, error, time.perf_counter() - started)
    except asyncio.CancelledError:
        raise
    except BaseException as error:  # noqa: BLE001 - consumer code may raise anything
        # SystemExit or KeyboardInterrupt from a prepare must not end the runner's loop.
        return Outcome(work, Result.FAILED, error, time.perf_counter() - started)
    finally:
        # The outcome is the attempt's last write, and the loop must not close under one.
        await saves.settled()
        if work.window_start is not None:
            await run_db(starts.confirm, [work])
    return Outcome(work, Result.SUCCEEDED, None, time.perf_counter() - started)

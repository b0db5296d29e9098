"""A ``save()`` on its way to the journal writer, and how its caller is told the outcome:
a sync caller waits on an event, an async one on a future of its own loop (see
:mod:`~nexus_workflows.deferred.runner.journal`)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.exceptions import ClaimLost


@dataclass(eq=False)
class Save:
    """One ``save()`` waiting for the writer: a sync caller waits on ``written``, an async
    one on ``future`` (of ``loop``, whose result is the ``clean`` patch); ``error`` is what
    the save raises, if anything."""

    work: ClaimedWork
    checkpoints: dict[str, Any]
    clean: dict[str, Any] | None = None
    written: threading.Event | None = None
    future: asyncio.Future[dict[str, Any]] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    error: BaseException | None = None
    # Completed (its error, or none, is final and its caller woken): at most once, by
    # whichever comes first of its writer and a stop that gave up on that writer.
    completed: bool = False
    # Since when (monotonic) another session's lock has held its row, and whether that
    # was said (see held_saves).
    held_since: float | None = None
    held_said: bool = False


#: Guards every ``Save.completed`` (a writer and a stop may complete one save at once).
_completion = threading.Lock()


def complete_once(saves: list[Save], error_of: Callable[[Save], BaseException | None]) -> None:
    """Complete those of ``saves`` not completed yet, each with ``error_of(save)``: a save
    a stop failed (its caller told ClaimLost) is not written again later by its stuck
    writer, nor is a written one failed by a stop that came after its writer."""
    with _completion:
        mine = [save for save in saves if not save.completed]
        for save in mine:
            save.completed = True
            save.error = error_of(save)
    _complete(mine)


@dataclass(eq=False)
class Call:
    """A function run on a writer's connection for another thread: an async attempt's (its
    result or error set on ``future``, of ``loop``) or a helper thread's (``done`` set once
    ``result`` or ``error`` is)."""

    function: Callable[..., Any]
    args: tuple[Any, ...]
    future: asyncio.Future[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    done: threading.Event | None = None
    result: Any = None
    error: BaseException | None = None


def _complete(saves: list[Save]) -> None:
    """Wake the callers of written (or failed) saves: sync ones one by one, async ones
    with one call per event loop (one wake-up of the loop for the whole batch)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Save]] = {}
    for save in saves:
        if save.loop is not None:
            by_loop.setdefault(save.loop, []).append(save)
        elif save.written is not None:
            save.written.set()
    for loop, settled in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, settled)


def _settle(saves: list[Save]) -> None:
    for save in saves:
        if save.future is not None:
            if save.error is None:
                # Written: the next save merges onto it, whether or not this one's caller
                # still waits (see execution.execute_async).
                save.work.checkpoints = save.checkpoints
            resolve(save.future, save.clean, save.error)


def resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the future's loop: its result or error, unless the awaiting attempt was
    cancelled meanwhile."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def claim_lost(work: ClaimedWork) -> ClaimLost:
    return ClaimLost(
        f"{work.kind} #{work.id}: this attempt no longer holds the work (it was "
        "reclaimed or changed by someone else); checkpoints not saved"
    )


def stopped(work: ClaimedWork) -> ClaimLost:
    """The runner stopped before this save was written: the attempt must end (its claim
    is kept and goes stale, as for any attempt that outlived the shutdown grace)."""
    return ClaimLost(f"{work.kind} #{work.id}: the runner stopped; checkpoints not saved")


def own_copy(error: BaseException) -> BaseException:
    try:
        copied = copy.copy(error)
    except Exception:  # noqa: BLE001 - an exception that cannot be copied is shared
        return error
    # copy.copy drops the cause: the driver's error, whose SQLSTATE tells a read-only
    # database (an outage) from an error of the work (see nexus_workflows.database_errors).
    copied.__cause__ = error.__cause__
    return copied

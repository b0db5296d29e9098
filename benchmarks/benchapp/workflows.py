"""Workflows the benchmark's runner process knows about."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from nexus_workflows import workflow


def by_key(trigger: dict[str, Any]) -> str:
    return str(trigger["key"])


@workflow("bench-noop", dedupe_key=by_key, retry_schedule=[1])
def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    """Does nothing: the benchmark measures the machinery around it."""


@workflow("bench-quick", dedupe_key=by_key, retry_schedule=[1])
def quick(trigger: Any, checkpoints: Any, save: Any) -> None:
    """Waits ``trigger["sleep"]`` seconds (a few ms: quick work that is not a no-op)."""
    time.sleep(trigger["sleep"])


@workflow("bench-latency", dedupe_key=by_key, retry_schedule=[1])
def latency(trigger: Any, checkpoints: Any, save: Any) -> None:
    """Journals the moment it started, for enqueue-to-start latency."""
    save({"started": time.time()})


# --- The I/O workload (benchmarks/io_workload.py): each job waits IO_WAIT seconds, as a
# call out over the network would, and journals one step when its trigger says so.

IO_WAIT = 0.2


@workflow("bench-io-sync", dedupe_key=by_key, retry_schedule=[1])
def io_sync(trigger: Any, checkpoints: Any, save: Any) -> None:
    """Waits in its thread, then (with ``save``) journals one step."""
    time.sleep(IO_WAIT)
    if trigger.get("save"):
        save({"called": True})


@workflow("bench-io-async", dedupe_key=by_key, retry_schedule=[1])
async def io_async(trigger: Any, checkpoints: Any, save: Any) -> None:
    """Waits on the runner's event loop, then (with ``save``) journals one step."""
    await asyncio.sleep(IO_WAIT)
    if trigger.get("save"):
        await save({"called": True})

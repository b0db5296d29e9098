"""Workflows with flow limits, for benchmarks/flow_control.py only (installed when
BENCH_FLOW=1), so that the other benchmarks' runners claim exactly what they did before."""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks.benchapp.workflows import by_key
from nexus_workflows import workflow


def journal(trigger: Any, started: float) -> None:
    """Appends "started ended" to the file the trigger names: no database write inside
    the measured attempt."""
    with open(trigger["journal"], "a") as journal:
        journal.write(f"{started:.6f} {time.time():.6f}\n")


@workflow("bench-capped", dedupe_key=by_key, retry_schedule=[1], concurrency=4)
def capped(trigger: Any, checkpoints: Any, save: Any) -> None:
    """A 200 ms attempt of a kind capped at four running at once."""
    started = time.time()
    time.sleep(0.2)
    journal(trigger, started)


@workflow("bench-rate", dedupe_key=by_key, retry_schedule=[1], rate_limit=(20, 1))
def rated(trigger: Any, checkpoints: Any, save: Any) -> None:
    """Journals the moment it started: the benchmark counts starts per second from these."""
    journal(trigger, time.time())


@workflow("bench-serial", dedupe_key=by_key, retry_schedule=[1], serial_key=lambda t: t["to"])
def serial(trigger: Any, checkpoints: Any, save: Any) -> None:
    """Does nothing, one at a time per key."""


@workflow("bench-single", dedupe_key=by_key, retry_schedule=[1], concurrency=1)
def single(trigger: Any, checkpoints: Any, save: Any) -> None:
    """One at a time: writes "<pid> <time>" to its journal as it starts (which runner
    holds the slot, and when), then waits ``seconds``."""
    with open(trigger["journal"], "a") as journal:
        journal.write(f"{os.getpid()} {time.time():.6f}\n")
    time.sleep(trigger["seconds"])

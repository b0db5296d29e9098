"""Workflows the benchmark's runner process knows about."""

from __future__ import annotations

import time
from typing import Any

from nexus_workflows import workflow


def by_key(trigger: dict[str, Any]) -> str:
    return str(trigger["key"])


@workflow("bench-noop", dedupe_key=by_key, retry_schedule=[1])
def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    """Does nothing: the benchmark measures the machinery around it."""


@workflow("bench-latency", dedupe_key=by_key, retry_schedule=[1])
def latency(trigger: Any, checkpoints: Any, save: Any) -> None:
    """Journals the moment it started, for enqueue-to-start latency."""
    save({"started": time.time()})


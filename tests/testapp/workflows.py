"""Workflows that runner processes started by the tests know about.

In-process tests register their own workflows with the ``register_workflow`` fixture;
a ``runworkflows`` or ``rqworker`` subprocess only knows what autodiscovery imports,
which is this.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import redis
from django.conf import settings

from nexus_workflows import PermanentError, workflow

from .models import Ledger

SCHEDULE = [0.01, 0.01, 0.01]


def by_key(trigger: dict[str, Any]) -> str:
    return str(trigger["key"])


def record(kind: str, trigger: dict[str, Any], step: str = "done") -> None:
    Ledger.objects.create(kind=kind, key=str(trigger["key"]), step=step, pid=os.getpid())


@workflow("test-ledger", dedupe_key=by_key, retry_schedule=SCHEDULE)
def ledger(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Records one ledger row per completed body."""
    if trigger.get("sleep"):
        time.sleep(trigger["sleep"])
    record("test-ledger", trigger)


@workflow("test-two-steps", dedupe_key=by_key, retry_schedule=SCHEDULE)
def two_steps(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Step one is journalled; then, on the first run only, it hangs (the test kills
    the runner there). A reclaiming runner resumes at step two."""
    if not checkpoints.get("step_one"):
        record("test-two-steps", trigger, "step-one")
        save({"step_one": True})
        if trigger.get("hang_file"):
            Path(trigger["hang_file"]).write_text(str(os.getpid()))
            time.sleep(600)
    record("test-two-steps", trigger, "step-two")


@workflow("test-slow", dedupe_key=by_key, retry_schedule=SCHEDULE)
def slow(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Runs for ``seconds`` (longer than STALE_AFTER in the tests), then records."""
    if trigger.get("started_file"):
        Path(trigger["started_file"]).write_text(str(os.getpid()))
    time.sleep(trigger["seconds"])
    record("test-slow", trigger)


@workflow("test-outcomes", dedupe_key=by_key, retry_schedule=SCHEDULE)
def outcomes(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """``{"outcome": "done"}`` succeeds, ``"retry once"`` fails its first attempt then
    succeeds, ``"permanent"`` is abandoned at once."""
    if trigger["outcome"] == "permanent":
        raise PermanentError("rejected upstream")
    if trigger["outcome"] == "retry once" and not checkpoints.get("failed_once"):
        save({"failed_once": True})
        raise ConnectionError("upstream timed out")
    record("test-outcomes", trigger)


# --- fire-and-forget (no retry schedule): run by RQ workers --------------------------------


def control_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_TEST_URL)


@workflow("test-ff-ledger", dedupe_key=by_key)
def ff_ledger(trigger: dict[str, Any]) -> None:
    """Records one ledger row. With ``hold``, first says it started (Redis key
    ``ff-test:started:<key>``) and waits until the test pushes ``ff-test:release:<key>``."""
    if trigger.get("hold"):
        control = control_redis()
        control.set(f"ff-test:started:{trigger['key']}", os.getpid())
        control.blpop([f"ff-test:release:{trigger['key']}"], timeout=30)
    record("test-ff-ledger", trigger)


class UpstreamRejected(Exception):
    pass


@workflow("test-ff-fail", dedupe_key=by_key)
def ff_fail(trigger: dict[str, Any]) -> None:
    """Records a ledger row, then fails with the trigger's ``secret`` in the message
    (standing in for patient data an upstream error might echo)."""
    record("test-ff-fail", trigger)
    raise UpstreamRejected(f"upstream rejected the message for {trigger.get('secret', '')}")


@workflow("test-ff-file", dedupe_key=by_key)
def ff_file(trigger: dict[str, Any]) -> None:
    """Writes a file (no database needed), proving that prepare ran and where."""
    Path(trigger["path"]).write_text(f"prepared {trigger['key']} in process {os.getpid()}")

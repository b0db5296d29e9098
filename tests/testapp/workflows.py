"""Workflows that runner processes started by the tests know about.

In-process tests register their own workflows with the ``register_workflow`` fixture;
a ``runworkflows`` or ``rqworker`` subprocess only knows what autodiscovery imports,
which is this.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections

from nexus_workflows import PermanentError, workflow
from nexus_workflows.signals import attempt_started
from tests.testapp.models import Ledger

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


@workflow("test-noop", dedupe_key=by_key, retry_schedule=SCHEDULE)
def noop(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Does nothing (for ``sleep`` seconds): a quick plain backlog (tests/flow/test_busy_runner.py)."""
    pause(trigger.get("sleep", 0))


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


def append_line(path: str, *fields: Any) -> None:
    """One line appended to a ledger file shared by processes (O_APPEND: whole lines)."""
    line = " ".join(str(field) for field in (os.getpid(), *fields)) + "\n"
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, line.encode())
    finally:
        os.close(descriptor)


@workflow("test-interval", dedupe_key=by_key, retry_schedule=SCHEDULE)
def interval(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Writes ``start``, a ``tick`` every 10 ms for ``seconds`` (or until ``until_file``
    exists), runs ``steps`` journalled steps of ``step_seconds`` (ticking too), then
    writes ``end`` to the ledger file ``trigger["ledger"]``, each line with the wall-clock
    time: the intervals in which the item was executing. ``linger_at_exit`` makes the
    process take that long to exit, as a metrics or error-reporting client flushing at
    exit does."""
    ledger = trigger["ledger"]
    key = trigger["key"]
    if trigger.get("linger_at_exit"):
        atexit.register(time.sleep, trigger["linger_at_exit"])
    append_line(ledger, key, "start", time.time())
    pause = threading.Event()  # not time.sleep: libfaketime breaks it (see under_faketime)
    until = Path(trigger["until_file"]) if trigger.get("until_file") else None

    def tick_for(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until and until.exists()):
            pause.wait(min(0.01, seconds))
            append_line(ledger, key, "tick", time.time())

    tick_for(trigger.get("seconds", 0))
    # Steps, each journalled: a retry resumes after the last one saved.
    for step in range(trigger.get("steps", 0)):
        if checkpoints.get(f"step{step}"):
            continue
        tick_for(trigger.get("step_seconds", 0))
        save({f"step{step}": True})
        append_line(ledger, key, f"step{step}", time.time())
    append_line(ledger, key, "end", time.time())


@workflow("test-ends-when-told", dedupe_key=by_key, retry_schedule=SCHEDULE)
def ends_when_told(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Its first attempt journals that it began, waits until ``until_file`` exists, then
    ends as ``trigger["end"]`` says: ``"done"``, ``"transient"`` (rescheduled),
    ``"outage"`` (the database unreachable: released, attempt unchanged) or
    ``"permanent"`` (abandoned). A later attempt succeeds at once."""
    if checkpoints.get("began"):
        return
    save({"began": True})
    until = Path(trigger["until_file"])
    pause = threading.Event()  # not time.sleep: libfaketime breaks it (see under_faketime)
    while not until.exists():
        pause.wait(0.01)
    if trigger["end"] == "transient":
        raise ConnectionError("upstream timed out")
    if trigger["end"] == "outage":
        raise OperationalError("the database went away")
    if trigger["end"] == "permanent":
        raise PermanentError("rejected upstream")


@workflow("test-interval-async", dedupe_key=by_key, retry_schedule=SCHEDULE)
async def interval_async(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """``test-interval`` as an ``async def`` prepare (on the runner's event loop): the same
    ledger lines, ``await save(...)`` per step."""
    ledger = trigger["ledger"]
    key = trigger["key"]
    append_line(ledger, key, "start", time.time())
    until = Path(trigger["until_file"]) if trigger.get("until_file") else None

    async def tick_for(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not (until and until.exists()):
            await asyncio.sleep(min(0.01, seconds))
            append_line(ledger, key, "tick", time.time())

    await tick_for(trigger.get("seconds", 0))
    for step in range(trigger.get("steps", 0)):
        if checkpoints.get(f"step{step}"):
            continue
        await tick_for(trigger.get("step_seconds", 0))
        await save({f"step{step}": True})
        append_line(ledger, key, f"step{step}", time.time())
    append_line(ledger, key, "end", time.time())


@workflow("test-blocking-async", dedupe_key=by_key, retry_schedule=SCHEDULE)
async def blocking_async(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """An ``async def`` prepare that blocks in a thread (a blocking SDK call through
    ``asyncio.to_thread``, as any async ORM call does) for ``seconds``, after touching
    ``started_file``."""
    Path(trigger["started_file"]).touch()
    await asyncio.to_thread(threading.Event().wait, trigger["seconds"])


# --- a prepare's own ORM use, on sessions the server ends (tests/faults/test_prepare_sessions.py)


@workflow("test-orm-sync", dedupe_key=by_key, retry_schedule=SCHEDULE)
def orm_sync(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Queries through the ORM on its worker thread's connection (kept between attempts)."""
    record("test-orm-sync", trigger)


@workflow("test-orm-sync-to-async", dedupe_key=by_key, retry_schedule=SCHEDULE)
async def orm_sync_to_async(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Queries through ``sync_to_async`` (the one thread, and connection, every async
    attempt of the runner shares)."""
    await sync_to_async(record)("test-orm-sync-to-async", trigger)


@workflow("test-orm-async", dedupe_key=by_key, retry_schedule=SCHEDULE)
async def orm_async(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Queries through Django's async ORM methods (on that same thread and connection)."""
    key = str(trigger["key"])
    if not await Ledger.objects.filter(kind="test-orm-async", key=key).aexists():
        await Ledger.objects.acreate(kind="test-orm-async", key=key, step="done", pid=os.getpid())


@workflow("test-orm-sync-session-ends", dedupe_key=by_key, retry_schedule=SCHEDULE)
def orm_sync_session_ends(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Queries (``before``); on its first run, touches ``waiting_file`` and waits until
    ``until_file`` exists (the test ends that connection's session meanwhile); then
    queries again (``after``)."""
    record("test-orm-sync-session-ends", trigger, "before")
    if not checkpoints.get("waited"):
        save({"waited": True})
        Path(trigger["waiting_file"]).touch()
        while not Path(trigger["until_file"]).exists():
            pause(0.01)
    record("test-orm-sync-session-ends", trigger, "after")


@workflow("test-orm-async-session-ends", dedupe_key=by_key, retry_schedule=SCHEDULE)
async def orm_async_session_ends(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """``test-orm-sync-session-ends`` as an ``async def`` prepare, through ``sync_to_async``."""
    await sync_to_async(record)("test-orm-async-session-ends", trigger, "before")
    if not checkpoints.get("waited"):
        await save({"waited": True})
        Path(trigger["waiting_file"]).touch()
        while not Path(trigger["until_file"]).exists():
            await asyncio.sleep(0.01)
    await sync_to_async(record)("test-orm-async-session-ends", trigger, "after")


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
    runs = Ledger.objects.filter(kind="test-ff-fail", key=str(trigger["key"])).count()
    if "fail_runs" in trigger and runs > trigger["fail_runs"]:
        return  # failed that many runs; this one succeeds (a job requeued after a fix, say)
    raise UpstreamRejected(f"upstream rejected the message for {trigger.get('secret', '')}")


@workflow("test-ff-file", dedupe_key=by_key)
def ff_file(trigger: dict[str, Any]) -> None:
    """Writes a file (no database needed), proving that prepare ran and where."""
    Path(trigger["path"]).write_text(f"prepared {trigger['key']} in process {os.getpid()}")


# --- flow control: attempts append "kind key group pid start end attempt" lines to the
# file the trigger names, so tests compute overlaps and rates from what ran, not from the
# app's own counters.


def pause(seconds: float) -> None:
    # Not time.sleep: under libfaketime (the clock-skew fault tests) it fails with EINVAL.
    threading.Event().wait(seconds)


def span(kind: str, trigger: dict[str, Any], body: Any = None) -> None:
    started = time.time()
    if trigger.get("hang_file") and not Path(trigger["hang_file"]).exists():
        Path(trigger["hang_file"]).write_text(str(os.getpid()))
        pause(600)
    pause(trigger.get("sleep", 0))
    ended = time.time()
    with open(trigger["ledger"], "a") as ledger:
        ledger.write(
            f"{kind} {trigger['key']} {trigger.get('to', '-')} {os.getpid()} {started:.6f} {ended:.6f}\n"
        )
    if trigger.get("fail_once") and not Path(trigger["fail_once"]).exists():
        Path(trigger["fail_once"]).write_text("failed")
        raise RuntimeError("failing the first attempt on purpose")


# Concurrency caps and serial keys need partial unique indexes; on a database without them
# (MySQL, MariaDB) the app refuses such kinds (system check E009, which would stop every
# runner process of the tests), so they are registered only where they can run. Their
# tests are about those databases (marked postgresql or needs("partial_indexes")).
CAPS_AND_SERIAL_KEYS = connections[DEFAULT_DB_ALIAS].features.supports_partial_indexes


def capped_or_keyed(kind: str, **options: Any) -> Any:
    """``@workflow(kind, …)`` where the database enforces caps and serial keys; elsewhere
    the function is left unregistered."""
    return workflow(kind, **options) if CAPS_AND_SERIAL_KEYS else lambda function: function


@capped_or_keyed("test-flow-capped", dedupe_key=by_key, retry_schedule=SCHEDULE, concurrency=2)
def flow_capped(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    span("test-flow-capped", trigger)


@capped_or_keyed(
    "test-flow-serial", dedupe_key=by_key, retry_schedule=SCHEDULE, serial_key=lambda t: t.get("to")
)
def flow_serial(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    span("test-flow-serial", trigger)


@capped_or_keyed(
    "test-flow-ordered",
    dedupe_key=by_key,
    retry_schedule=SCHEDULE,
    serial_key=lambda t: t.get("to"),
    ordered=True,
)
def flow_ordered(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    span("test-flow-ordered", trigger)


@workflow("test-flow-rate", dedupe_key=by_key, retry_schedule=SCHEDULE, rate_limit=(5, 1))
def flow_rate(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    span("test-flow-rate", trigger)


@workflow("test-flow-rate-handoff", dedupe_key=by_key, retry_schedule=SCHEDULE, rate_limit=(4, 1))
def flow_rate_handoff(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    span("test-flow-rate-handoff", trigger)


def slow_handoff(sender: Any, *, kind: str, **details: Any) -> None:
    """A slow hand-off from the claim to the attempt's start (a loaded host): the
    attempt_started signal runs in the worker thread between the two. Attempts claimed
    together then start spread out and out of step, which bunched starts in one window
    while the window was counted at claim time."""
    if kind == "test-flow-rate-handoff":
        pause(random.uniform(0, 0.6))


# Only in the runner processes of the test that asks for it: a receiver costs every
# attempt a signal, and other tests check that nobody listens.
if os.environ.get("NW_TEST_SLOW_HANDOFF"):
    attempt_started.connect(slow_handoff, dispatch_uid="tests.testapp.slow_handoff")


@capped_or_keyed(
    "test-flow-faults",
    dedupe_key=by_key,
    retry_schedule=SCHEDULE,
    concurrency=2,
    serial_key=lambda t: t.get("to"),
    rate_limit=(10, 1),
)
def flow_faults(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Every limit at once, for the fault suite (restarts, kill -9, clock skew)."""
    span("test-flow-faults", trigger)


@workflow(
    "test-flow-rate-key",
    dedupe_key=by_key,
    retry_schedule=SCHEDULE,
    rate_limit=(2, 1),
    rate_key=lambda t: t["to"],
)
def flow_rate_key(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    span("test-flow-rate-key", trigger)


@workflow("test-flow-inside", dedupe_key=by_key, retry_schedule=SCHEDULE)
def flow_inside(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
    """Three calls inside one job, each taking a start of one shared window (after
    ``sleep`` seconds, so that runners see the kind as slow and prefetch none of it)."""
    from nexus_workflows import rate_limited

    pause(trigger.get("sleep", 0))
    for call in range(3):
        with rate_limited("test:inside", 4, 1), open(trigger["ledger"], "a") as ledger:
            now = time.time()
            ledger.write(f"call {trigger['key']}.{call} - {os.getpid()} {now:.6f} {now:.6f}\n")

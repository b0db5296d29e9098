"""The drain's per-item CPU: look-ups whose answer does not change between items are not
made again for each one (a no-op drain's Python calls per item are its cost). Counted
with a profile hook on the runner's threads, while a real runner drains real rows."""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import time
from collections import Counter
from types import FrameType
from typing import Any

import pytest
from django.utils.connection import BaseConnectionHandler

from nexus_workflows import enqueue_many
from nexus_workflows.deferred import attempts
from nexus_workflows.deferred.runner import Runner, pool
from nexus_workflows.deferred.runner.heartbeat import MARK_STARTED_DELAY, Heartbeat
from nexus_workflows.deferred.runner.ledger import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

ITEMS = 30


def drain_counting(
    kind: str, codes: dict[str, Any], callers: dict[str, Any] | None = None
) -> tuple[int, Counter[str]]:
    """Drain ``kind`` with a runner (once) while counting calls of the ``codes`` (name:
    code object) in every thread, those named in ``callers`` only when made from that
    code object; returns (items done, calls by name)."""
    names = {code: name for name, code in codes.items()}
    callers = callers or {}
    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in names:
            name = names[frame.f_code]
            caller = callers.get(name)
            if caller is None or (frame.f_back is not None and frame.f_back.f_code is caller):
                calls[name] += 1

    threading.setprofile(profile)  # the worker threads the runner starts
    sys.setprofile(profile)
    try:
        stats = Runner(once=True, kinds=[kind], concurrency=2, install_signal_handlers=False).run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return stats.done, calls


def test_a_drain_inspects_a_workflows_prepare_once_not_per_item(register_workflow: Any) -> None:
    # Each item's lane (thread pool or event loop) depends on whether prepare is async.
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": f"k{number}"} for number in range(ITEMS)])
    done, calls = drain_counting(kind, {"inspect": inspect.iscoroutinefunction.__code__})
    assert done == ITEMS
    assert calls["inspect"] <= 2, calls


def test_a_log_line_looks_the_runs_allowed_up_once(
    register_workflow: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": f"k{number}"} for number in range(ITEMS)])
    with caplog.at_level(logging.INFO, logger="nexus_workflows"):
        done, calls = drain_counting(kind, {"max_attempts": attempts.max_attempts.__code__})
    assert done == ITEMS
    # Two lines per item (started, done); signals without receivers build nothing.
    assert calls["max_attempts"] <= 2 * ITEMS, calls
    assert caplog.text.count(": done") == ITEMS


def test_lines_below_the_loggers_level_build_nothing(
    register_workflow: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A runner whose INFO lines go nowhere (``-v 0``, a project logging WARNING and up)
    does not look up, number and format what it would have said."""
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": f"k{number}"} for number in range(ITEMS)])
    with caplog.at_level(logging.WARNING, logger="nexus_workflows"):
        done, calls = drain_counting(kind, {"max_attempts": attempts.max_attempts.__code__})
    assert done == ITEMS
    assert calls["max_attempts"] == 0, calls


def test_a_worker_taking_work_wakes_no_one_when_no_one_waits(register_workflow: Any) -> None:
    """A take tells a main loop waiting for the hand-off of a wake-up's claim that the work
    was taken; in a drain no one waits there, and each take paid for the notify."""
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": f"k{number}"} for number in range(ITEMS)])
    done, calls = drain_counting(
        kind,
        {"notify_all": threading.Condition.notify_all.__code__},
        callers={"notify_all": Ledger.take.__code__},
    )
    assert done == ITEMS
    assert calls["notify_all"] == 0, calls


def test_a_worker_whose_prepares_opened_no_connection_asks_django_for_none(register_workflow: Any) -> None:
    """Before each attempt a worker closes or checks the connections its prepares opened
    (test_pool); asking Django which a thread holds costs two exceptions per alias, paid
    per item by workers whose prepares never use the ORM, which hold none."""
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": f"k{number}"} for number in range(ITEMS)])
    done, calls = drain_counting(
        kind,
        {"all": BaseConnectionHandler.all.__code__},
        callers={"all": pool.check_connections.__code__},
    )
    assert done == ITEMS
    # A worker that waited over IDLE_CHECK_AFTER for its first item checks then (2 workers).
    assert calls["all"] <= 2, calls


def test_an_attempts_start_sets_the_heartbeats_marker_event_only_when_unset(register_workflow: Any) -> None:
    """Each start asks the heartbeat for a start marker; while one is wanted already the
    heartbeat has yet to read what is unmarked (this start among it), and each Event.set
    took its lock and notified."""
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": f"k{number}"} for number in range(ITEMS)])
    began = time.monotonic()
    done, calls = drain_counting(
        kind, {"set": threading.Event.set.__code__}, callers={"set": Heartbeat.started.__code__}
    )
    took = time.monotonic() - began
    assert done == ITEMS
    # The heartbeat clears it MARK_STARTED_DELAY after it was set, so a drain slowed by a
    # loaded machine may set it once per delay; per item (the old code) it never is.
    assert calls["set"] <= max(ITEMS // 3, 2 + took / MARK_STARTED_DELAY), (calls, took)

"""A given-up row of a kind with a ``concurrency`` cap (no write of its outcome got in)
keeps its slot: the slot is the row's, and the write that gives it back is the one the
database refused. It holds it as a dead runner's row does, until a reclaim: ``STALE_AFTER``
after its last heartbeat, and no longer; the reclaim keeps the slot and runs it again.
A real runner, a real trigger (``write_blocker``) refusing the first attempt's outcome."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from nexus_workflows import enqueue
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.models import DeferredWork, Status
from tests.processes import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.needs("partial_indexes")]

STALE_AFTER = 2
SETTINGS = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.2, "STALE_AFTER": STALE_AFTER, "SHUTDOWN_GRACE": 2}


def test_a_given_up_rows_slot_comes_back_with_its_reclaim(register_workflow: Any, write_blocker: Any) -> None:
    calls: list[str] = []

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        calls.append(trigger["key"])
        if calls.count(trigger["key"]) == 1 and trigger["key"] == "refused":
            raise ValueError("upstream said no")

    kind = register_workflow(prepare, retry_schedule=[60], concurrency=1).kind
    refused = enqueue(kind, {"key": "refused"})
    # The first attempt's outcome (a reschedule) is refused for good; the reclaim's passes.
    write_blocker.install("NEW.dedupe_key = 'refused' AND NEW.status = 'pending'")
    with override_settings(NEXUS_WORKFLOWS=SETTINGS):
        runner = Runner(kinds=[kind], concurrency=2, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            wait_for(lambda: calls == ["refused"], timeout=30, what="the first attempt")
            waiting = enqueue(kind, {"key": "waiting"})  # the cap's one slot is taken
            wait_for(lambda: runner.stats.unwritten == 1, timeout=30, what="the give-up")
            gave_up = time.monotonic()
            assert DeferredWork.objects.get(pk=waiting).status == Status.PENDING
            wait_for(
                lambda: DeferredWork.objects.get(pk=waiting).status == Status.DONE,
                timeout=STALE_AFTER + 20,
                what="the waiting item to get the slot",
            )
            freed_after = time.monotonic() - gave_up
        finally:
            runner.request_stop()
            thread.join(30)
            connection.close()
    assert not thread.is_alive()
    assert runner.stats.reclaimed == 1
    assert calls == ["refused", "refused", "waiting"]  # the reclaim ran first, in the slot
    assert DeferredWork.objects.get(pk=refused).status == Status.DONE
    # Bounded by STALE_AFTER from the last heartbeat (at most one interval before the
    # give-up), plus a stale check and two attempts: never held for ever.
    assert freed_after < STALE_AFTER + 3, freed_after

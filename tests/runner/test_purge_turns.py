"""A run of purge batches (one turn after another, no wait between) claims as an idle loop
would: at each poll interval, or at once when an attempt ended or a claim left due work
behind; each turn of a purge used to make a full claim, one more statement (per lane)
for every batch. Statements counted on the runner loop's own connection."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.backends.signals import connection_created
from django.test import override_settings
from django.utils import timezone

from nexus_workflows import enqueue
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.models import DeferredWork, Status
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = {
    "POLL_INTERVAL": 30,  # no poll falls within the purge: every claim in it is a turn's
    "HEARTBEAT_INTERVAL": 0.2,
    "STALE_AFTER": 30,
    "SHUTDOWN_GRACE": 2,
    "RETENTION": 3600,
    "PURGE_BATCH_SIZE": 10,
    "WAKEUP": False,
}
EXPIRED = 200


@pytest.fixture
def loop_statements() -> Iterator[list[str]]:
    """Every statement the runner's loop thread ("test-runner") sends, in order."""
    sent: list[str] = []

    def count(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        sent.append(sql)
        return execute(sql, params, many, context)

    def watch(sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "test-runner" and count not in connection.execute_wrappers:
            connection.execute_wrappers.append(count)

    connection_created.connect(watch, weak=False)
    yield sent
    connection_created.disconnect(watch)


def is_claim(sql: str) -> bool:
    """The due claim's read of due ids (due by next_attempt_at; the purge's reads are by
    updated_at)."""
    return sql.startswith("SELECT") and '"next_attempt_at" <=' in sql


def test_a_run_of_purge_batches_makes_no_claim_per_batch(
    register_workflow: Any, loop_statements: list[str]
) -> None:
    """On the old code: one claim per batch (21 claims for 20 batches)."""
    ran = threading.Event()
    kind = register_workflow(lambda t, c, s: ran.set(), retry_schedule=[1]).kind
    then = timezone.now() - timedelta(hours=2)
    DeferredWork.objects.bulk_create(
        DeferredWork(kind=kind, dedupe_key=f"old-{n}", trigger={}, status=Status.DONE, updated_at=then)
        for n in range(EXPIRED)
    )
    DeferredWork.objects.filter(kind=kind).update(updated_at=then)
    due = enqueue(kind, {"key": "due"})
    connections.close_all()
    with override_settings(NEXUS_WORKFLOWS=SETTINGS):
        runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            wait_for(
                lambda: DeferredWork.objects.filter(kind=kind, status=Status.DONE).count() == 1,
                timeout=30,
                what="the purge to end and the due item to run",
            )
        finally:
            runner.request_stop()
            thread.join(30)
    assert not thread.is_alive()
    assert runner.stats.purged == EXPIRED
    assert DeferredWork.objects.get(pk=due).status == Status.DONE  # claimed in the purge's run
    deletes = [sql for sql in loop_statements if sql.startswith("DELETE")]
    claims = [sql for sql in loop_statements if is_claim(sql)]
    assert len(deletes) >= EXPIRED // 10
    # The first turn's claim, and one after the due item's attempt ended (it woke the loop).
    assert len(claims) <= 3, len(claims)

"""A claim turn that fails part-way (a lock wait cut short, an outage between two kinds'
claims) still hands out what it had claimed: those rows are processing, holding their
slots, serial keys and reserved starts, and no other runner may take them until they go
stale (``STALE_AFTER``, five minutes by default).

In-process runners on the real PostgreSQL: another session holds a lock on one kind's
rate-window rows, and every connection of the runner has a short ``lock_timeout``, so
that kind's claim fails the way a lock wait cut short (or an outage) fails it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.backends.signals import connection_created
from django.db.models.functions import Now
from django.test import override_settings

from nexus_workflows import enqueue_many
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.flow.claiming import window_name
from nexus_workflows.flow.windows import free_slots
from nexus_workflows.models import DeferredWork, FlowWindowSlot, Status
from tests.processes import wait_for
from tests.raw_connections import raw_connection
from tests.test_runner_robustness import running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

# STALE_AFTER stays at its default (300 s): a claim dropped by the runner would hold its
# rows far longer than these tests wait.
QUICK = {"POLL_INTERVAL": 0.05, "WAKEUP": False}
RATE = (5, 60.0)


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def capped_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


@contextlib.contextmanager
def short_lock_waits() -> Iterator[None]:
    """Every new PostgreSQL connection (the runner's) waits at most 200 ms for a lock."""

    def set_lock_timeout(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 200")

    connection_created.connect(set_lock_timeout)
    connection.close()  # this thread's next query reconnects with it too
    try:
        yield
    finally:
        connection_created.disconnect(set_lock_timeout)
        connection.close()


@contextlib.contextmanager
def window_locked(kind: str) -> Iterator[Any]:
    """Another session locks the rows of ``kind``'s rate window until the block ends or it
    calls the ``release`` it yields."""
    free_slots(window_name(kind), "", *RATE, using="default")  # the window's rows exist
    session = raw_connection()
    session.execute("BEGIN")
    table = connection.ops.quote_name(FlowWindowSlot._meta.db_table)
    session.execute(f"SELECT 1 FROM {table} WHERE name = %s FOR UPDATE", [window_name(kind)])
    try:
        yield lambda: session.execute("ROLLBACK")
    finally:
        session.close()


def count(kind: str, status: str) -> int:
    return DeferredWork.objects.filter(kind=kind, status=status).count()


def test_rows_claimed_before_another_kinds_claim_failed_still_run(register_workflow: Any) -> None:
    capped = register_workflow(capped_prepare, retry_schedule=[1], concurrency=2).kind
    rated = register_workflow(noop, retry_schedule=[1], rate_limit=RATE).kind
    enqueue_many(capped, [{"key": n} for n in range(2)])
    enqueue_many(rated, [{"key": n} for n in range(2)])
    with (
        override_settings(NEXUS_WORKFLOWS=QUICK),
        window_locked(rated) as release,
        short_lock_waits(),
        running(capped, rated, concurrency=4),
    ):
        # Each turn the rated kind's claim fails (its window's rows are locked); the capped
        # kind's rows, claimed in the same turn, run all the same.
        wait_for(lambda: count(capped, Status.DONE) == 2, timeout=15, what="the capped kind's work to run")
        assert count(rated, Status.PENDING) == 2  # its claims were rolled back whole
        release()
        wait_for(lambda: count(rated, Status.DONE) == 2, timeout=15, what="the rated kind's work to run")
    lost = DeferredWork.objects.filter(lost_unstarted__gt=0).count()
    assert lost == 0


def test_stale_rows_reclaimed_before_another_kinds_reclaim_failed_still_run(register_workflow: Any) -> None:
    capped = register_workflow(capped_prepare, retry_schedule=[1, 1], concurrency=2).kind
    rated = register_workflow(noop, retry_schedule=[1, 1], rate_limit=RATE).kind
    enqueue_many(capped, [{"key": n} for n in range(2)])
    enqueue_many(rated, [{"key": n} for n in range(2)])
    # A runner that died holding all of them (slots, and reserved starts given back).
    held = Claimer(kinds=[capped, rated], using="default").claim_due(10)
    assert len(held) == 4
    FlowWindowSlot.objects.filter(name=window_name(rated)).update(started_at=Now() - timedelta(hours=1))
    DeferredWork.objects.update(heartbeat_at=Now() - timedelta(hours=1))
    with (
        override_settings(NEXUS_WORKFLOWS=QUICK),
        window_locked(rated) as release,
        short_lock_waits(),
        running(capped, rated, concurrency=4),
    ):
        wait_for(lambda: count(capped, Status.DONE) == 2, timeout=15, what="the capped kind's work to run")
        release()
        wait_for(lambda: count(rated, Status.DONE) == 2, timeout=15, what="the rated kind's work to run")

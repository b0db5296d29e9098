"""Per-minute outcome counts: one upsert per batch of outcomes, added up per minute."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.models import Sum
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from nexus_workflows import PermanentError, enqueue
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.models import DeferredWork, OutcomeCount, Status
from nexus_workflows.observability import counts
from nexus_workflows.observability.clock import database_now

pytestmark = pytest.mark.django_db(transaction=True)


def test_adding_twice_in_one_minute_adds_up_in_one_statement_each() -> None:
    with CaptureQueriesContext(connection) as queries:
        batch = {("k", "done"): 3, ("k", "abandoned"): 1, ("other", "done"): 2}
        counts.add(batch, token="a", using="default")
    # PostgreSQL: one statement (the token by a CTE); SQLite and MariaDB: the token, then
    # the counts.
    writes = [q for q in queries if q["sql"].startswith(("INSERT", "WITH"))]
    assert len(writes) == (1 if connection.vendor == "postgresql" else 2)
    counts.add({("k", "done"): 4, ("k", "rescheduled"): 0}, token="b", using="default")
    rows = {(row.kind, row.outcome): row.count for row in OutcomeCount.objects.all()}
    assert rows == {("k", "done"): 7, ("k", "abandoned"): 1, ("other", "done"): 2}
    minutes = set(OutcomeCount.objects.values_list("minute", flat=True))
    assert len(minutes) in (1, 2)  # a minute may have turned between the calls
    now = database_now("default")
    for minute in minutes:
        assert (minute.second, minute.microsecond) == (0, 0)
        assert 0 <= (now - minute).total_seconds() < 120


def test_a_drain_writes_counts_that_match_the_outcomes_with_one_upsert_per_batch(
    register_workflow: Any,
) -> None:
    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        if trigger["key"].startswith("bad"):
            raise PermanentError("no")
        if trigger["key"].startswith("retry"):
            raise ConnectionError("later")

    kind = register_workflow(prepare, retry_schedule=[5]).kind
    for number in range(200):
        enqueue(kind, {"key": f"ok-{number}"})
    for number in range(7):
        enqueue(kind, {"key": f"bad-{number}"})
        enqueue(kind, {"key": f"retry-{number}"})
    table = OutcomeCount._meta.db_table
    with override_settings(NEXUS_WORKFLOWS={"BATCH_SIZE": 50}), CaptureQueriesContext(connection) as queries:
        stats = Runner(once=True, kinds=[kind], install_signal_handlers=False).run()
    assert (stats.done, stats.abandoned, stats.rescheduled) == (200, 7, 7)
    totals = dict(OutcomeCount.objects.filter(kind=kind).values_list("outcome").annotate(n=Sum("count")))
    assert totals == {"done": 200, "abandoned": 7, "rescheduled": 7}
    assert DeferredWork.objects.filter(kind=kind, status=Status.DONE).count() == totals["done"]
    upserts = [q for q in queries if f"INSERT INTO {connection.ops.quote_name(table)}" in q["sql"]]
    done_writes = [q for q in queries if q["sql"].startswith("UPDATE") and "'done'" in q["sql"]]
    # One upsert per batch of outcomes written, never one per item.
    assert 1 <= len(upserts) <= len(done_writes) + 14
    assert len(upserts) < 214 / 4


def test_a_batch_sent_again_under_its_token_is_not_added_twice() -> None:
    # What a runner does when the answer to a committed batch was lost in an outage.
    assert counts.add({("k", "done"): 5}, token="t1", using="default")
    assert not counts.add({("k", "done"): 5}, token="t1", using="default")
    assert counts.add({("k", "done"): 2}, token="t2", using="default")
    assert OutcomeCount.objects.aggregate(n=Sum("count"))["n"] == 7


def test_old_counts_are_purged() -> None:
    counts.add({("k", "done"): 1}, token="t", using="default")
    now = database_now("default")
    assert counts.purge(now, using="default") == 0
    assert counts.purge(now + counts.KEEP + counts.KEEP, using="default") == 1
    assert not OutcomeCount.objects.exists()

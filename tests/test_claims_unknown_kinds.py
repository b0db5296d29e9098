"""Due rows of kinds and task queues no runner here takes (a workflow removed from the
code, a queue nobody runs): the claim's order across the kinds and queues it does take is
unchanged, and on PostgreSQL and MariaDB the claim does not read those rows at all."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.models import DeferredWork
from tests.examined import rows_examined

pytestmark = pytest.mark.django_db(transaction=True)

TASK = "tests.testapp.tasks.add"
UNKNOWN_KIND = "a-workflow-removed-from-the-code"


def row(key: str, *, kind: str, due: datetime, priority: int = 0, queue: str = "") -> DeferredWork:
    return DeferredWork(
        kind=kind,
        dedupe_key=key,
        trigger={},
        next_attempt_at=due,
        priority=priority,
        queue_name=queue,
        backend_name="default" if queue else "",
    )


@pytest.fixture
def two_kinds(register_workflow: Any) -> list[str]:
    return [register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind for _ in range(2)]


def interleaved(kinds: list[str], start: datetime) -> list[DeferredWork]:
    """Rows of two kinds, tasks of two queues at three priorities, and rows of an unknown
    kind and an unknown queue (the most urgent of all) between each."""
    rows = []
    for n in range(12):
        due = start + timedelta(seconds=n)
        rows.append(row(f"w{n}", kind=kinds[n % 2], due=due))
        queue = ("default", "other")[n % 2]
        after = due + timedelta(milliseconds=500)  # no ties: an order by due time alone
        rows.append(row(f"t{n}", kind=TASK, due=after, priority=(-5, 0, 7)[n % 3], queue=queue))
        rows.append(row(f"u{n}", kind=UNKNOWN_KIND, due=due - timedelta(hours=1), priority=9))
        rows.append(row(f"q{n}", kind=TASK, due=due - timedelta(hours=1), priority=9, queue="nobody"))
    return rows


def claim_all(claimer: Claimer, now: datetime | None = None) -> list[str]:
    keys = dict(DeferredWork.objects.values_list("pk", "dedupe_key"))
    order: list[str] = []
    while works := claimer.claim_due(5, now=now):
        order += [keys[work.id] for work in works]
    return order


@pytest.mark.parametrize("given_now", [False, True], ids=["database's now", "now given"])
@pytest.mark.parametrize("queues", [["default", "other"], None], ids=["two queues", "every queue"])
def test_the_claim_takes_priority_then_due_time_across_kinds_and_queues_past_unknown_rows(
    two_kinds: list[str], queues: list[str] | None, given_now: bool
) -> None:
    start = timezone.now() - timedelta(minutes=10)
    rows = interleaved(two_kinds, start)
    later = row("later", kind=two_kinds[0], due=timezone.now() + timedelta(minutes=30), priority=0)
    DeferredWork.objects.bulk_create([*rows, later])
    every_queue = ("default", "other", "nobody")
    taken = [r for r in rows if r.kind in two_kinds or r.queue_name in (queues or every_queue)]
    taken += [later] if given_now else []  # due by the time given, not yet by the database's
    expected = [r.dedupe_key for r in sorted(taken, key=lambda r: (-r.priority, r.next_attempt_at))]
    now = timezone.now() + timedelta(hours=1) if given_now else None
    assert claim_all(Claimer(kinds=two_kinds, queues=queues, using="default"), now) == expected
    left = set(DeferredWork.objects.filter(status="pending").values_list("kind", "queue_name"))
    assert (UNKNOWN_KIND, "") in left
    assert ((TASK, "nobody") in left) == (queues is not None)


def test_workflow_kinds_alone_and_queues_alone_keep_their_order(two_kinds: list[str]) -> None:
    DeferredWork.objects.bulk_create(interleaved(two_kinds, timezone.now() - timedelta(minutes=10)))
    workflows = claim_all(Claimer(kinds=two_kinds, queues=[], using="default"))
    assert workflows == [f"w{n}" for n in range(12)]
    assert claim_all(Claimer(kinds=[], queues=["other"], using="default")) == [
        f"t{n}"
        for n in (5, 11, 1, 7, 3, 9)  # priority 7, 0, -5; then by due time
    ]


def _fill_behind_unknown_rows(kinds: list[str], queues: list[str] | None) -> None:
    """5,000 due rows of an unknown kind (and, for a runner of one queue, 5,000 of a queue
    it does not take) due before 2,000 rows of real work, and the table's statistics."""
    ahead = timezone.now() - timedelta(days=1)
    DeferredWork.objects.bulk_create(
        row(f"u{n}", kind=UNKNOWN_KIND, due=ahead + timedelta(seconds=n), priority=9) for n in range(5_000)
    )
    if queues is not None:
        DeferredWork.objects.bulk_create(
            row(f"q{n}", kind=TASK, due=ahead, priority=9, queue="nobody") for n in range(5_000)
        )
    # Real work enough that reading all of it and sorting is not the planner's choice.
    now = timezone.now()
    DeferredWork.objects.bulk_create(row(f"w{n}", kind=kinds[n % 2], due=now) for n in range(1_000))
    DeferredWork.objects.bulk_create(row(f"t{n}", kind=TASK, due=now, queue="default") for n in range(1_000))
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {DeferredWork._meta.db_table}")
            cursor.fetchall()  # its report
        else:
            cursor.execute(f"ANALYZE {DeferredWork._meta.db_table}")


@pytest.mark.postgresql
@pytest.mark.parametrize("queues", [["default"], None], ids=["one queue", "every queue"])
def test_a_claim_on_postgresql_does_not_read_due_rows_it_does_not_take(
    two_kinds: list[str], queues: list[str] | None
) -> None:
    """The claim's read examines a few rows, not the unknown ones ahead. Filtering the
    nw_due_idx order by kind, it examined every one of them."""
    _fill_behind_unknown_rows(two_kinds, queues)
    with CaptureQueriesContext(connection) as queries:
        assert len(Claimer(kinds=two_kinds, queues=queues, using="default").claim_due(3)) == 3
    read = queries.captured_queries[0]["sql"]  # the read of candidates, before the UPDATE
    assert not read.upper().startswith("UPDATE"), read
    examined = rows_examined(read)
    assert examined < 100, f"the claim's read examined {examined} rows to take 3"


@pytest.mark.mysql
@pytest.mark.parametrize("queues", [["default"], None], ids=["one queue", "every queue"])
def test_a_claim_on_mariadb_does_not_read_due_rows_it_does_not_take(
    two_kinds: list[str], queues: list[str] | None
) -> None:
    """The same on MariaDB (migration 0018's indexes, sql.mysql.due_ids): every read of the
    claim (a runner of every queue first finds the queues with pending tasks) examines a
    few rows. Through nw_due_idx filtered by kind and queue, the read examined 5,000 or
    10,000 rows ahead of the real work."""
    _fill_behind_unknown_rows(two_kinds, queues)
    with CaptureQueriesContext(connection) as queries:
        assert len(Claimer(kinds=two_kinds, queues=queues, using="default").claim_due(3)) == 3
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].upper().startswith("SELECT")]
    reads = [sql for sql in reads if "FOR UPDATE" not in sql.upper()]  # not the row locks
    assert reads
    examined = sum(rows_examined(sql) for sql in reads)
    assert examined < 100, f"the claim's reads examined {examined} rows to take 3"

"""The flow claim's read of a limited kind's candidates on PostgreSQL and MariaDB: a read of
that kind's due rows (``nw_due_kind_idx``; on MariaDB ``nw_mariadb_due_kind_idx``), not of
every due row in the claim's order filtered by kind, so due rows of other kinds ahead of it
are never walked past."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.models import DeferredWork, FlowWindowSlot, Status
from tests.examined import rows_examined

pytestmark = pytest.mark.django_db(transaction=True)

OTHER_KIND = "a-kind-ahead-of-the-limited-one"


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def _fill(kind: str, *, ahead: int, own: int) -> None:
    """``ahead`` due rows of another kind, more urgent and longer due than the ``own``
    rows of ``kind`` (three priorities, so the order is not the due time alone)."""
    earlier = timezone.now() - timedelta(days=1)
    DeferredWork.objects.bulk_create(
        DeferredWork(
            kind=OTHER_KIND,
            dedupe_key=f"o{n}",
            trigger={},
            priority=9,
            next_attempt_at=earlier + timedelta(milliseconds=n),
        )
        for n in range(ahead)
    )
    now = timezone.now()
    DeferredWork.objects.bulk_create(
        DeferredWork(
            kind=kind,
            dedupe_key=f"w{n}",
            trigger={},
            priority=(-1, 0, 1)[n % 3],
            next_attempt_at=now - timedelta(seconds=n % 7),
        )
        for n in range(own)
    )
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {DeferredWork._meta.db_table}")
            cursor.fetchall()  # its report
        else:
            cursor.execute(f"ANALYZE {DeferredWork._meta.db_table}")


@pytest.mark.postgresql
@pytest.mark.parametrize(
    "flow",
    [{"concurrency": 3}, {"rate_limit": (3, 60)}, {"concurrency": 3, "rate_limit": (3, 60)}],
    ids=["concurrency", "rate limit", "both"],
)
def test_a_limited_kind_s_read_does_not_walk_past_other_kinds_due_rows(
    register_workflow: Any, flow: dict[str, Any]
) -> None:
    """20,000 due rows of another kind ahead of 1,000 of a limited kind: the candidate
    read examines a few rows. Ordered by ``priority DESC`` it read nw_due_idx filtered by
    kind, walking past every one of them."""
    kind = register_workflow(noop, retry_schedule=[1], **flow).kind
    _fill(kind, ahead=20_000, own=1_000)
    with CaptureQueriesContext(connection) as queries:
        works = Claimer(kinds=[kind], using="default").claim_due(3)
    assert len(works) == 3
    reads = [q["sql"] for q in queries.captured_queries if f"'{kind}'" in q["sql"]]
    candidates = [sql for sql in reads if sql.lstrip().upper().startswith("SELECT") and "ORDER BY" in sql]
    assert candidates, reads
    for read in candidates:
        examined = rows_examined(read)
        assert examined < 200, f"the limited kind's read examined {examined} rows to take 3"


def test_the_limited_kind_s_claims_keep_priority_then_due_time_then_id(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], concurrency=4).kind
    _fill(kind, ahead=50, own=60)
    expected = list(
        DeferredWork.objects.filter(kind=kind)
        .order_by("-priority", "next_attempt_at", "pk")
        .values_list("pk", flat=True)
    )
    claimer = Claimer(kinds=[kind], using="default")
    order: list[int] = []
    while works := claimer.claim_due(4):
        order += [work.id for work in works]
        DeferredWork.objects.filter(pk__in=[work.id for work in works]).update(
            status=Status.DONE, flow_slot=None
        )
    assert order == expected


@pytest.mark.mysql
@pytest.mark.parametrize("per_key", [False, True], ids=["one window", "per rate key"])
def test_a_rate_limited_kind_s_read_on_mariadb_does_not_walk_past_other_kinds_due_rows(
    register_workflow: Any, per_key: bool
) -> None:
    """The same on MariaDB (a rate limit: concurrency caps and serial keys are refused
    there), through migration 0018's nw_mariadb_due_kind_idx: 5,000 due rows of another
    kind ahead of 1,000 of the limited kind, and the candidate read examines a few rows,
    with a rate key too (its read counts each candidate's window in a subquery). Through
    nw_due_idx filtered by kind it walked past all of them. The optimizer chooses the index
    itself (not forced: ``sql.mysql``)."""
    flow: dict[str, Any] = {"rate_limit": (3, 60)}
    if per_key:
        flow["rate_key"] = lambda trigger: str(trigger)
    kind = register_workflow(noop, retry_schedule=[1], **flow).kind
    _fill(kind, ahead=5_000, own=1_000)
    with CaptureQueriesContext(connection) as queries:
        assert len(Claimer(kinds=[kind], using="default").claim_due(3)) == 3
    reads = [q["sql"] for q in queries.captured_queries if f"'{kind}'" in q["sql"]]
    candidates = [sql for sql in reads if sql.lstrip().upper().startswith("SELECT") and "ORDER BY" in sql]
    assert candidates, reads
    # The window as the claim found it (its 3 starts free): run again with the window full,
    # the read per rate key would walk every due row of the kind, none having room.
    FlowWindowSlot.objects.update(started_at=datetime(1970, 1, 1, tzinfo=UTC))
    for read in candidates:
        examined = rows_examined(read)
        assert examined < 200, f"the limited kind's read examined {examined} rows to take 3"

"""Revive reads the ids it acts on where it writes them (the router's database for writes),
never from a read replica that lags: with replication lag, ``workflows revive
--all-abandoned`` and the admin's "select all" missed rows abandoned since the replica's
snapshot. The ``direct`` alias is the replica here: a second connection to the same
PostgreSQL database whose session reads from a snapshot taken before the row existed."""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections
from django.urls import reverse

from nexus_workflows.models import DeferredWork, Status
from tests.admin.conftest import client_for
from tests.admin.test_admin import CHANGELIST, message_texts

pytestmark = [
    pytest.mark.postgresql,
    pytest.mark.django_db(transaction=True, databases=["default", "direct"]),
]


@pytest.fixture
def lagging_replica(settings) -> Iterator[None]:
    """Reads of deferred work go to ``direct``, frozen at a snapshot taken now (as a replica
    that has not caught up); writes go to ``default``."""
    settings.DATABASE_ROUTERS = ["tests.testapp.routers.WorkReadFromDirect"]
    replica = connections["direct"]
    with replica.cursor() as cursor:
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cursor.execute(f"SELECT count(*) FROM {DeferredWork._meta.db_table}")
    try:
        yield
    finally:
        replica.close()  # its snapshot ends with it


def test_revive_all_abandoned_revives_rows_the_lagging_replica_lacks(make_work, lagging_replica):
    abandoned = make_work(Status.ABANDONED)  # after the replica's snapshot
    assert not DeferredWork.objects.filter(pk=abandoned.pk).exists()  # the router reads the replica

    out = StringIO()
    call_command("workflows", "revive", "--all-abandoned", stdout=out, stderr=StringIO())

    assert out.getvalue().splitlines()[-1] == "revived 1, skipped 0"
    assert DeferredWork.objects.using("default").get(pk=abandoned.pk).status == Status.PENDING


def test_select_all_revive_in_the_admin_revives_rows_the_lagging_replica_lacks(
    triager, make_work, lagging_replica
):
    listed = make_work(Status.ABANDONED)  # before the snapshot: the replica has it
    connections["direct"].close()
    with connections["direct"].cursor() as cursor:
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cursor.execute(f"SELECT count(*) FROM {DeferredWork._meta.db_table}")
    unlisted = make_work(Status.ABANDONED)  # since: only the primary has it

    response = client_for(triager).post(
        reverse(CHANGELIST) + "?status=abandoned",
        {"action": "revive_selected", "_selected_action": [listed.pk], "select_across": "1", "index": 0},
        follow=True,
    )

    assert message_texts(response) == [("success", "Revived 2 items; skipped none.")]
    rows = DeferredWork.objects.using("default")
    assert {rows.get(pk=listed.pk).status, rows.get(pk=unlisted.pk).status} == {Status.PENDING}

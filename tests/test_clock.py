"""nexus_workflows.clock: the database's clock, and times it writes that compare equal."""

from __future__ import annotations

from datetime import UTC, timedelta
from typing import Any

import pytest
from django.utils import timezone

from nexus_workflows.clock import DatabaseNow, database_now
from nexus_workflows.deferred.enqueue import enqueue
from nexus_workflows.models import DeferredWork

pytestmark = pytest.mark.django_db


def test_a_time_the_database_stamped_equals_the_value_read_back(register_workflow: Any) -> None:
    """A compare-and-set on a timestamp (the admin's revive) must match the row it read,
    on SQLite too, where times are text."""
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    work_id = int(enqueue(kind, {"key": "clock"}))
    rows = DeferredWork.objects.filter(pk=work_id)
    for _ in range(50):  # some of them land on a whole millisecond, or a whole second
        rows.update(updated_at=DatabaseNow())
        stamped = rows.values_list("updated_at", flat=True).get()
        assert rows.filter(updated_at=stamped).exists()


def test_database_now_is_the_database_time_and_aware() -> None:
    now = database_now("default")

    assert now.tzinfo is not None
    assert abs(now - timezone.now()) < timedelta(seconds=5)
    assert now.utcoffset() == UTC.utcoffset(None)


@pytest.mark.django_db(transaction=True)  # the session is closed at the end
def test_the_database_clock_is_utc_whatever_the_sessions_time_zone(register_workflow: Any) -> None:
    """Django stores and reads MySQL's and MariaDB's datetimes as UTC, but its ``Now()``
    there is ``CURRENT_TIMESTAMP``, the session's local time, and Django leaves the session
    in the server's zone: on a server not in UTC, every time the database wrote (claims,
    heartbeats, due times) was off by the offset. A session at +05:00 stands for one.
    (PostgreSQL's sessions are in UTC, which Django sets on every connection; SQLite has no
    zone.) The margin, a minute, is far below the offset and far above a loaded machine's
    delays."""
    from django.db import connection

    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    rows = DeferredWork.objects.filter(pk=int(enqueue(kind, {"key": "zone"})))
    try:
        if connection.vendor == "mysql":
            with connection.cursor() as cursor:
                cursor.execute("SET time_zone = '+05:00'")
        rows.update(updated_at=DatabaseNow())
        stamped = rows.values_list("updated_at", flat=True).get()
        now = database_now("default")
    finally:
        connection.close()  # the next session is in the server's own zone again
    assert abs(stamped - timezone.now()) < timedelta(minutes=1)
    assert abs(now - timezone.now()) < timedelta(minutes=1)

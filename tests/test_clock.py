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

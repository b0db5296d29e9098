"""A task's priority, queue name and ``run_after`` of a type Django's own checks do not
take, or a ``run_after`` outside ten years of now, are refused with the backend's
``InvalidTaskOptions`` (named by type, never by value), when the task is set up with
``using()``, before anything is written. Django's checks raised ``TypeError``,
``ValueError`` or ``AttributeError``; a ``run_after`` near ``datetime.max`` in a zone west
of UTC was stored on PostgreSQL as the year 10000, and every later read of the row (the
admin's list among them) failed."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from nexus_workflows.models import DeferredWork
from nexus_workflows.tasks import InvalidTaskOptions
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

WEST = dt.timezone(dt.timedelta(hours=-5))
EAST = dt.timezone(dt.timedelta(hours=5))


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (
            {"priority": float("nan")},
            "priority must be a whole number from -100 to 100; got a float that is not",
        ),
        ({"priority": "5"}, "priority must be a whole number from -100 to 100; got a string"),
        ({"priority": Decimal("5")}, "priority must be a whole number"),
        ({"queue_name": ["emails"]}, "queue_name must be a string; got a list"),
        ({"run_after": "2030-01-01T00:00:00Z"}, "run_after must be None or an aware datetime; got a string"),
        (
            {"run_after": dt.date(2030, 1, 1)},
            "run_after must be None or an aware datetime; got a value of type date",
        ),
        ({"run_after": dt.datetime.max.replace(tzinfo=WEST)}, "run_after must be within ten years of now"),
        ({"run_after": dt.datetime.min.replace(tzinfo=EAST)}, "run_after must be within ten years of now"),
        ({"run_after": dt.datetime(2999, 1, 1, tzinfo=dt.UTC)}, "run_after must be within ten years of now"),
    ],
)
def test_an_option_of_the_wrong_type_or_range_is_refused_naming_its_type(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(InvalidTaskOptions) as caught:
        tasks.record.using(**options).enqueue("María López")
    assert says in str(caught.value)
    assert "tests.testapp.tasks.record" in str(caught.value)
    assert "2030" not in str(caught.value)
    assert "emails" not in str(caught.value)
    assert not DeferredWork.objects.exists()


def test_options_in_range_are_taken() -> None:
    later = timezone.now() + dt.timedelta(days=365 * 9)
    result = tasks.record.using(priority=5.0, run_after=later.astimezone(WEST)).enqueue("k")
    row = DeferredWork.objects.get(dedupe_key=result.id)
    assert row.priority == 5
    assert abs(row.next_attempt_at - later) < dt.timedelta(seconds=1)

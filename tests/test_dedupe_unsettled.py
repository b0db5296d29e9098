"""An enqueue whose dedupe key never settles gives up with the app's ``DedupeKeyUnsettled``
(a ``WorkflowError``, still a ``RuntimeError``), naming the kind, never the key. Before: a
plain ``RuntimeError``, which a caller catching the app's errors missed. A real trigger
skips every INSERT of the kind (no row, no error), so each round finds the key neither
inserted nor stored, as when a conflicting row is purged before it can be read, every time.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection

from nexus_workflows import enqueue, enqueue_many, exceptions
from nexus_workflows.models import DeferredWork
from tests.conftest import work_table

pytestmark = [pytest.mark.postgresql, pytest.mark.django_db]

KEY = "patient-4711-visit"


def _noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    return None


@contextmanager
def inserts_vanish(kind: str) -> Iterator[None]:
    """Every INSERT of ``kind`` into the work table is skipped by the database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION nw_test_skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$"
        )
        cursor.execute(
            f"CREATE TRIGGER nw_test_skip BEFORE INSERT ON {work_table()} FOR EACH ROW "
            "WHEN (NEW.kind = %s) EXECUTE FUNCTION nw_test_skip()",
            [kind],
        )
    try:
        yield
    finally:  # the test's transaction would take them away too, but only at its end
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER nw_test_skip ON {work_table()}")
            cursor.execute("DROP FUNCTION nw_test_skip()")


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_key_that_never_settles_raises_the_apps_error_without_the_key(register_workflow, many):
    workflow = register_workflow(_noop, retry_schedule=[1])
    call = (
        (lambda: enqueue_many(workflow.kind, [{"key": KEY}]))
        if many
        else (lambda: enqueue(workflow.kind, {"key": KEY}))
    )

    with inserts_vanish(workflow.kind), pytest.raises(exceptions.WorkflowError) as raised:
        call()

    assert type(raised.value).__name__ == "DedupeKeyUnsettled"
    assert isinstance(raised.value, RuntimeError)
    message = str(raised.value)
    assert f"workflow {workflow.kind!r}: could not settle" in message
    assert "after 5 rounds" in message
    assert KEY not in message
    assert "4711" not in message
    assert not DeferredWork.objects.filter(kind=workflow.kind).exists()

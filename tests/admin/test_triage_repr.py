"""A triage result names the work it changed and skipped by kind and id: its repr (shown
by tracebacks, debuggers and a caller's ``log("%r", result)``) carries no dedupe key."""

from __future__ import annotations

import pytest

from nexus_workflows.deferred import triage
from nexus_workflows.models import DeferredWork, Status

pytestmark = pytest.mark.django_db

KEY = "+52 55 8731 4926"


def test_the_repr_of_a_revive_result_has_no_dedupe_key(make_work):
    revived = make_work(Status.ABANDONED, dedupe_key=KEY)
    skipped = make_work(Status.DONE, dedupe_key=f"{KEY} (2)")

    result = triage.revive(DeferredWork.objects.filter(pk__in=[revived.pk, skipped.pk]), by="admin")

    assert [ref.dedupe_key for ref in result.changed] == [KEY]  # still there for --reveal
    assert f"pk={revived.pk}" in repr(result)
    assert f"pk={skipped.pk}" in repr(result)
    assert "8731" not in repr(result)

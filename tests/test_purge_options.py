"""``purge_batch`` and ``prune_rate_windows`` refuse a batch size or lock wait they cannot use
with the app's exception (a ``WorkflowError`` and a ``ValueError``) whose message says what is
allowed, before anything is read or deleted. Before: Django's ``ValueError`` ("Negative
indexing is not supported") for -5, ``PURGE_BATCH_SIZE`` for 0, a ``TypeError`` for "10"."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from django.db import router
from django.utils import timezone

from nexus_workflows import exceptions
from nexus_workflows.deferred.retention import prune_rate_windows, purge_batch
from nexus_workflows.models import DeferredWork, Status

pytestmark = pytest.mark.django_db


@pytest.fixture
def expired_row() -> DeferredWork:
    work = DeferredWork.objects.create(kind="k", dedupe_key="visit-1", trigger={}, status=Status.DONE)
    DeferredWork.objects.filter(pk=work.pk).update(updated_at=timezone.now() - timedelta(days=30))
    return work


def refused(call: Any) -> exceptions.WorkflowError:
    with pytest.raises(exceptions.WorkflowError) as raised:
        call()
    assert type(raised.value).__name__ == "InvalidPurgeOption"
    assert isinstance(raised.value, ValueError)
    return raised.value


# 2**63: past what the database's LIMIT takes (a raw DataError, IntegrityError on SQLite).
@pytest.mark.parametrize("size", [-5, 0, "10", 2.5, True, 10_001, 2**63, 10**30], ids=repr)
def test_a_batch_size_that_is_not_a_whole_number_from_1_is_refused(expired_row, size):
    error = refused(lambda: purge_batch(batch_size=size))

    assert "batch_size must be" in str(error)
    assert "at least 1" in str(error)
    assert repr(size) not in str(error)  # the value is not echoed
    assert DeferredWork.objects.filter(pk=expired_row.pk).exists()  # nothing deleted


@pytest.mark.parametrize("wait", [-1, 0, math.nan, math.inf, "1", False], ids=repr)
def test_a_lock_wait_that_is_not_a_finite_number_above_0_is_refused(expired_row, wait):
    for call in (
        lambda: purge_batch(lock_wait=wait),
        lambda: prune_rate_windows(router.db_for_write(DeferredWork), wait),
    ):
        assert "lock_wait must be a finite number of seconds above 0" in str(refused(call))
    assert DeferredWork.objects.filter(pk=expired_row.pk).exists()


def test_none_means_the_setting_and_a_good_size_purges(expired_row):
    assert purge_batch(batch_size=None, lock_wait=None) == 1
    assert purge_batch(batch_size=1, lock_wait=0.5) == 0

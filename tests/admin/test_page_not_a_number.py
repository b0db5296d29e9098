"""A list URL whose page is not a number (``?p=x``, a mangled link) is page 1 to Django's
change list: the estimate is checked by page 1's rows then too. Trusted as it was, a low
estimate of the done rows (the rest of an estimated total, after a burst of enqueues) made
Django's list take the whole slice as one page and read every row of it."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.test import RequestFactory

from nexus_workflows.admin.changelist import LIST_COUNTER
from nexus_workflows.models import DeferredWork
from tests.admin.test_list_at_scale import fill_done

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 43


@pytest.mark.parametrize("page", ["x", "", "1.5"])
def test_a_page_that_is_not_a_number_has_its_estimate_checked_as_page_one(workflow: Any, page: str) -> None:
    fill_done(workflow.kind, ROWS)
    request = RequestFactory().get("/", {"status": "done", "p": page})
    setattr(request, LIST_COUNTER, lambda: (5, True))  # the done slice's estimate: low
    model_admin = admin.site._registry[DeferredWork]

    paginator = model_admin.get_paginator(request, DeferredWork.objects.order_by("pk"), 10)

    # Django's list shows page 1 and, if the count says one page, every row unsliced.
    assert (paginator.count, paginator.estimated) == (ROWS, False)
    assert paginator.num_pages == 5
    assert len(paginator.page(1).object_list) == 10

"""A counted list's back-half page read from the list's other end keeps the paginator's
``orphans``: the last page holds the rows Django's own paginator puts on it (a project's
admin that passes ``orphans`` to ``get_paginator``), none dropped; so does an estimated
list's, whether the estimate was low or high."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.paginator import Paginator

from nexus_workflows.admin.counting import EstimatingPaginator
from nexus_workflows.models import DeferredWork
from tests.admin.test_list_at_scale import fill_done

pytestmark = pytest.mark.django_db(transaction=True)

ROWS = 43  # pages of 10 with 3 orphans: 4 pages, the last one 13 rows


def test_the_last_page_read_from_the_other_end_keeps_its_orphans(workflow: Any) -> None:
    fill_done(workflow.kind, ROWS)
    rows = DeferredWork.objects.order_by("pk")
    expected = Paginator(rows, 10, orphans=3).page(4)
    paginator = EstimatingPaginator(rows, 10, orphans=3)
    paginator.exact = True  # counted: the back half is read from the other end

    page = paginator.page(4)

    assert [work.pk for work in page.object_list] == [work.pk for work in expected.object_list]
    assert len(page.object_list) == 13


@pytest.mark.parametrize("estimate", [38, 43, 47, 60])
def test_an_estimated_list_shows_the_last_page_with_its_orphans_whatever_the_estimate(
    workflow: Any, estimate: int
) -> None:
    """The estimate (low, right, high) is corrected by the rows read: the real last page
    holds its orphans, a page asked for at or past the estimate's last shows it too."""
    fill_done(workflow.kind, ROWS)
    rows = DeferredWork.objects.order_by("pk")
    expected = [work.pk for work in Paginator(rows, 10, orphans=3).page(4).object_list]
    estimated_last = Paginator(range(estimate), 10, orphans=3).num_pages
    for wanted in sorted({4, estimated_last, estimated_last + 1}):
        paginator = EstimatingPaginator(rows, 10, orphans=3)
        paginator.counter = lambda: (estimate, True)
        paginator.wanted = wanted
        page = paginator.page(wanted)
        assert (paginator.count, paginator.estimated) == (ROWS, False), (wanted, estimate)
        assert [work.pk for work in page.object_list] == expected, (wanted, estimate)
        assert page.number == 4

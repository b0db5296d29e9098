"""The end of the triage list: a page total that is the database's estimate is corrected
by the rows of the page asked for, so the last page shows the real last rows and an exact
count, and a page past the end (a stale link, an estimate that was high) shows the last
page saying there are no more rows, instead of an empty page or Django's error redirect."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from nexus_workflows.admin.counting import count
from nexus_workflows.models import DeferredWork, Status
from tests.admin.conftest import client_for
from tests.admin.test_list_at_scale import TABLE, fill_done

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:nexus_workflows_deferredwork_changelist"
FILLED = 25_000
KEPT = 20_010  # 400 full pages and a last one of 10 rows
PAST_END = "No more rows past page"


@pytest.fixture
def stale_statistics(workflow: Any) -> Iterator[str]:
    """FILLED done rows analysed, then all but KEPT deleted with the statistics left as they
    were (as after a purge, before autovacuum): PostgreSQL still estimates about FILLED."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
    try:
        fill_done(workflow.kind, FILLED)
        newest = DeferredWork.objects.order_by("-pk").values_list("pk", flat=True)[FILLED - KEPT - 1]
        DeferredWork.objects.filter(pk__gte=newest).delete()
        assert DeferredWork.objects.count() == KEPT
        estimate, estimated = count(DeferredWork.objects.all(), filtered=False)
        assert estimated  # the premise: a high estimate
        assert estimate > KEPT + 2_000, estimate
        yield workflow.kind
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} RESET (autovacuum_enabled)")


def last_rows() -> list[int]:
    return list(DeferredWork.objects.order_by("pk").values_list("pk", flat=True)[: KEPT % 50])[::-1]


def paginator_text(html: str) -> str:
    return re.sub(r"\s+", " ", html[html.find('<p class="paginator">') :][:2000])


@pytest.mark.postgresql
@pytest.mark.parametrize("filters", [{}, {"status": "done"}, {"kind": "KIND"}])
def test_the_estimated_last_page_and_past_it_show_the_real_last_rows(
    superuser: Any, stale_statistics: str, filters: dict[str, str]
) -> None:
    filters = {name: stale_statistics if value == "KIND" else value for name, value in filters.items()}
    client = client_for(superuser)
    first = client.get(reverse(CHANGELIST), filters)
    estimated_pages = first.context["cl"].paginator.num_pages
    assert first.context["cl"].paginator.estimated  # "about", past the rows
    assert estimated_pages > 401
    for page in (estimated_pages, estimated_pages + 1, 10_000):
        response = client.get(reverse(CHANGELIST), {**filters, "p": page})
        assert response.status_code == 200, (page, response.get("Location"))
        cl = response.context["cl"]
        assert [work.pk for work in cl.result_list] == last_rows(), page
        assert (cl.result_count, cl.paginator.estimated, cl.page_num) == (KEPT, False, 401)
        html = response.content.decode()
        assert f"{PAST_END} 401: this is the last page." in html
        assert f"{KEPT} deferred work" in paginator_text(html)
        assert "nw-estimated" not in paginator_text(html)


@pytest.mark.postgresql
def test_the_real_last_page_counts_exactly_and_the_one_before_says_about(
    superuser: Any, stale_statistics: str
) -> None:
    client = client_for(superuser)
    last = client.get(reverse(CHANGELIST), {"p": 401})
    assert [work.pk for work in last.context["cl"].result_list] == last_rows()
    assert (last.context["cl"].result_count, last.context["cl"].paginator.estimated) == (KEPT, False)
    assert PAST_END not in last.content.decode()
    before = client.get(reverse(CHANGELIST), {"p": 400})
    assert len(before.context["cl"].result_list) == 50
    assert before.context["cl"].paginator.estimated  # more rows follow: still the estimate
    assert before.context["cl"].paginator.num_pages > 401


@pytest.mark.postgresql
def test_show_all_is_not_offered_or_honoured_on_an_estimated_list(
    superuser: Any, stale_statistics: str
) -> None:
    response = client_for(superuser).get(reverse(CHANGELIST), {"all": ""})
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 50
    assert 'class="showall"' not in response.content.decode()


def test_a_counted_list_asked_for_a_page_past_its_end_shows_its_last_page(
    superuser: Any, make_work: Any
) -> None:
    """A stale link (rows revived or purged since): the last page, not Django's ``?e=1``."""
    made = [make_work(Status.ABANDONED).pk for _ in range(55)]
    response = client_for(superuser).get(reverse(CHANGELIST), {"status": "abandoned", "p": 7})
    assert response.status_code == 200, response.get("Location")
    assert sorted(work.pk for work in response.context["cl"].result_list) == made[:5]
    assert response.context["cl"].page_num == 2
    assert f"{PAST_END} 2: this is the last page." in response.content.decode()
    # Read from the list's other end: the same rows, in the same order, whatever the sort.
    for index, work in enumerate(DeferredWork.objects.filter(pk__in=made[::7])):
        work.next_attempt_at = work.next_attempt_at.replace(year=2030 + index % 3)
        work.save(update_fields=["next_attempt_at"])
    client = client_for(superuser)
    for order in ("5", "-5.1", "2.-5"):
        query = {"status": "abandoned", "o": order}
        first = client.get(reverse(CHANGELIST), {**query, "p": 1}).context["cl"]
        in_order = list(first.queryset.values_list("pk", flat=True))  # the list's order, read forwards
        last = client.get(reverse(CHANGELIST), {**query, "p": 2}).context["cl"].result_list
        past = client.get(reverse(CHANGELIST), {**query, "p": 9}).context["cl"].result_list
        assert [work.pk for work in first.result_list] == in_order[:50], order
        assert [work.pk for work in last] == in_order[50:], order
        assert [work.pk for work in past] == in_order[50:], order


def test_a_page_filtered_by_kind_counts_its_rows_once_and_never_the_done_rows(
    superuser: Any, make_work: Any, workflow: Any
) -> None:
    """Done rows are the total less what needs action (on MariaDB their own count read the
    whole table under a kind filter: 160 ms at 300,000 rows), and the paginator takes the
    summary's count of the list's status instead of counting again."""
    for status in (Status.DONE, Status.DONE, Status.PENDING, Status.ABANDONED):
        make_work(status)
    client = client_for(superuser)
    for filters in ({"kind": workflow.kind}, {"kind": workflow.kind, "status": "done"}):
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse(CHANGELIST), filters)
        summary = {item.value: item.count for item in response.context["cl"].status_summary}
        assert (summary[None], summary["done"], summary["pending"]) == (4, 2, 1)
        assert response.context["cl"].result_count == (2 if "status" in filters else 4)
        counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
        assert not [sql for sql in counts if "'done'" in sql], counts
        assert len(counts) == len(set(counts)), counts  # nothing counted twice


def offsets(queries: CaptureQueriesContext) -> list[int]:
    return [int(found) for q in queries.captured_queries for found in re.findall(r"OFFSET (\d+)", q["sql"])]


@pytest.mark.parametrize("filters", [{}, {"status": "done"}])
def test_the_estimated_last_page_is_read_from_the_other_end_not_past_every_row(
    superuser: Any, workflow: Any, filters: dict[str, str]
) -> None:
    """Counted (no row fetched), then read in reversed order: no OFFSET of every row
    before it (the last of 300,000: 910 ms on PostgreSQL). SQLite counts every list: its
    back half was read so already."""
    fill_done(workflow.kind, FILLED)
    client = client_for(superuser)
    last = client.get(reverse(CHANGELIST), filters).context["cl"].paginator.num_pages
    in_order = list(DeferredWork.objects.order_by("-pk").values_list("pk", flat=True))
    for page in (last, last + 1):  # the estimate's last page may be before the real one (low)
        shown = min(page, FILLED // 50)
        with CaptureQueriesContext(connection) as queries:
            response = client.get(reverse(CHANGELIST), {**filters, "p": page})
        cl = response.context["cl"]
        assert [work.pk for work in cl.result_list] == in_order[(shown - 1) * 50 : shown * 50], page
        assert (cl.result_count, cl.paginator.estimated, cl.page_num) == (FILLED, False, shown)
        assert max(offsets(queries), default=0) < FILLED // 2, offsets(queries)

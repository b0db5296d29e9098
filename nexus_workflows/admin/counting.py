"""Counting for the triage desk's list at production scale.

A retained table holds mostly done rows (a day of a busy platform is hundreds of thousands),
and counting them exactly reads every one: at 300,000 rows the list's counts per status
and its paginator's count took most of a page's 300-450 ms on PostgreSQL. What needs action
is counted exactly, through the partial indexes that already serve the runners and the
purge (pending, processing, stale, abandoned); done rows, and a page's total, are the
database's estimate (read from its statistics, no row read) once that estimate is at least
:data:`EXACT_UP_TO`, and the page says "about". Below it, or where the database gives no
estimate (SQLite; MariaDB under a kind filter), they are counted.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import EmptyResultSet
from django.core.paginator import Paginator
from django.db.models import QuerySet
from django.utils.functional import cached_property

from nexus_workflows import sql

#: Rows below which an estimate is replaced by an exact count (cheap at that size).
EXACT_UP_TO = 20_000


def estimated_rows(queryset: QuerySet[Any], *, filtered: bool) -> int | None:
    """The database's estimate of ``queryset``'s rows, or None where it gives none.
    ``filtered``: the query has conditions beyond the status (some estimates are poor then)."""
    statements = sql.for_connection(queryset.db)
    if not hasattr(statements, "estimated_rows"):
        return None
    try:
        query, params = queryset.order_by().values("pk").query.sql_with_params()
    except EmptyResultSet:  # .none(), or an empty IN: counted without a query
        return None
    return statements.estimated_rows(queryset.db, query, params, filtered=filtered)


def count(queryset: QuerySet[Any], *, filtered: bool = True) -> tuple[int, bool]:
    """``(rows, estimated)``: the estimate when it is at least :data:`EXACT_UP_TO`, else
    an exact count."""
    estimate = estimated_rows(queryset, filtered=filtered)
    if estimate is not None and estimate >= EXACT_UP_TO:
        return estimate, True
    return queryset.count(), False


class EstimatingPaginator(Paginator):
    """Django's paginator, counting as :func:`count` does: past a large estimate, "about".
    The last page of an estimate may come out short or empty; the order and the rows of
    each page are exact."""

    #: Conditions beyond the status are applied (see :func:`estimated_rows`).
    filtered = True
    #: Count exactly whatever the size (a slice that needs action).
    exact = False
    estimated = False

    @cached_property
    def count(self) -> int:
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]  # the admin's queryset
        if self.exact:
            return rows.count()
        total, self.estimated = count(rows, filtered=self.filtered)
        return total

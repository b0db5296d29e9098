"""Counting for the triage desk's list at production scale.

A retained table holds mostly done rows (a day of a busy platform is hundreds of thousands),
and counting them exactly reads every one: at 300,000 rows the list's counts per status
and its paginator's count took most of a page's 300-450 ms on PostgreSQL. What needs action
is counted exactly, through the partial indexes that already serve the runners and the
purge (pending, processing, stale, abandoned); done rows, and a page's total, are the
database's estimate (read from its statistics, no row read) once that estimate is at least
:data:`EXACT_UP_TO`, and the page says "about". Below it, or where the database gives no
estimate (SQLite; MariaDB under a kind filter), they are counted.

A page's counts, its total and its rows are read in one snapshot where the database gives
one to a reader (:func:`one_snapshot`): under a draining runner, counts taken in separate
statements disagreed (a row counted pending, then processing too), and a page read from
the list's other end, placed by its total, showed rows of its neighbour or missed some.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from django.contrib.admin.views.main import PAGE_VAR
from django.core.exceptions import EmptyResultSet
from django.core.paginator import EmptyPage, Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest
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
        # Compiled for its own database (sql_with_params compiles for "default"): a filter's
        # subquery bound to a replica's alias is refused for another ("across databases").
        query, params = queryset.order_by().values("pk").query.get_compiler(queryset.db).as_sql()
    except EmptyResultSet:  # .none(), or an empty IN: counted without a query
        return None
    return statements.estimated_rows(queryset.db, query, params, filtered=filtered)


def large_estimate(queryset: QuerySet[Any], *, filtered: bool = True) -> int | None:
    """The database's estimate of the rows when it is at least :data:`EXACT_UP_TO` (shown
    as "about"); None when they are to be counted."""
    estimate = estimated_rows(queryset, filtered=filtered)
    return estimate if estimate is not None and estimate >= EXACT_UP_TO else None


def count(queryset: QuerySet[Any], *, filtered: bool = True) -> tuple[int, bool]:
    """``(rows, estimated)``: :func:`large_estimate`, else an exact count."""
    estimate = large_estimate(queryset, filtered=filtered)
    return (estimate, True) if estimate is not None else (queryset.count(), False)


#: The databases whose reads this context makes in one snapshot (:func:`one_snapshot`).
_SNAPSHOTS: ContextVar[tuple[str, ...]] = ContextVar("nexus_workflows_snapshots", default=())


@contextlib.contextmanager
def one_snapshot(using: str) -> Iterator[bool]:
    """The block's reads in one snapshot of ``using`` (a read-only ``REPEATABLE READ``
    transaction: PostgreSQL, MariaDB); True if so. Not on SQLite, whose transactions take
    the write lock in this project (``IMMEDIATE``): its counts are one statement instead (see
    ``TriageChangeList.status_counts``). Nor inside a transaction already open (the isolation
    level is its first statement's)."""
    snapshot = getattr(sql.for_connection(using), "read_only_snapshot", None)
    if snapshot is None:
        yield False
        return
    with snapshot(using) as taken:
        token = _SNAPSHOTS.set((*_SNAPSHOTS.get(), using) if taken else _SNAPSHOTS.get())
        try:
            yield taken
        finally:
            _SNAPSHOTS.reset(token)


def in_snapshot(using: str) -> bool:
    """Whether reads of ``using`` are in a :func:`one_snapshot` block that took one."""
    return using in _SNAPSHOTS.get()


def snapshot_taken() -> str | None:
    """The database of the innermost :func:`one_snapshot` block that took one, if any."""
    taken = _SNAPSHOTS.get()
    return taken[-1] if taken else None


def page_wanted(request: HttpRequest) -> int:
    """The page a list's ``?p=`` asks for, as Django's list reads it: 1 when it is not a
    number (Django shows page 1, so its estimate is checked as page 1's; unchecked, a low
    one of a slice made the list one page of every row), or less than 1 (refused later)."""
    try:
        return max(int(request.GET.get(PAGE_VAR, 1)), 1)
    except ValueError:
        return 1


class EstimatingPaginator(Paginator):
    """Django's paginator, counting as :func:`count` does: past a large estimate, "about".

    An estimate is off by a few per cent, which at the end of a long list is whole pages: so
    the rows of the page asked for (:attr:`wanted`) are read with one more, and the count
    corrected by them. Rows found but no more: the count is exact (the real last page). More
    than a page: at least one page more. The estimate's last page or past it: counted
    exactly, once, and read from the list's other end as the back half of a counted list is
    (not past an offset of every row before it). A page asked for past the last is shown as
    the last page (:attr:`past_end`), not Django's error redirect."""

    #: Conditions beyond the status are applied (see :func:`estimated_rows`).
    filtered = True
    #: Count exactly whatever the size (a slice that needs action).
    exact = False
    estimated = False
    #: The page the list asks for (its ``?p=``), read ahead to check an estimate near its end.
    wanted: int | None = None
    #: ``() -> (rows, estimated)``: the list's own count of these rows, when it has one.
    counter: Callable[[], tuple[int, bool]] | None = None
    #: The page asked for was past the last row; the last page was shown instead.
    past_end = False
    _read_ahead: tuple[int, list[Any]] | None = None

    @cached_property
    def count(self) -> int:
        total, self.estimated = self._counted()
        if self.estimated and self.wanted:
            return self._checked(total, self.wanted)
        return total

    def _counted(self) -> tuple[int, bool]:
        if self.counter is not None:
            return self.counter()
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]  # the admin's queryset
        if self.exact:
            return rows.count(), False
        return count(rows, filtered=self.filtered)

    def _checked(self, estimate: int, number: int) -> int:
        """``estimate`` corrected by the rows of page ``number`` and the one after them."""
        rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]
        bottom = (number - 1) * self.per_page
        if bottom + self.per_page + self.orphans >= estimate:
            # The estimate's last page, or past it: counted (no row fetched), then read from
            # the other end (see page), not past an offset of every row before: the last of
            # 300,000 read that way took 910 ms on PostgreSQL. The estimate may be low or high.
            self.estimated = False
            return rows.count()
        # With its orphans, the last page holds up to per_page + orphans rows.
        ahead = list(rows[bottom : bottom + self.per_page + self.orphans + 1])
        if len(ahead) > self.per_page + self.orphans:  # more follow: at least one page more
            self._read_ahead = (number, ahead[: self.per_page])
            return max(estimate, bottom + len(ahead))
        self.estimated = False
        if ahead:  # the real last page: the count is known
            self._read_ahead = (number, ahead)
            return bottom + len(ahead)
        return rows.count()  # past the end (the estimate was high): counted, once

    def page(self, number: Any) -> Page:
        try:
            number = self.validate_number(number)
        except EmptyPage:
            if int(number) < 1:
                raise
            self.past_end, number = True, self.num_pages
        if self._read_ahead is not None and self._read_ahead[0] == number:
            return Page(self._read_ahead[1], number, self)
        bottom = (number - 1) * self.per_page
        if not self.estimated and self.count - bottom < bottom:
            # In the back half of a counted list: read from its other end, not past an
            # offset of every row before (the last of 300,000: 910 ms on PostgreSQL).
            rows: QuerySet[Any] = self.object_list  # type: ignore[assignment]
            top = bottom + self.per_page
            if top + self.orphans >= self.count:  # the last page takes its orphans, as Django's
                top = self.count
            return Page(list(rows.reverse()[self.count - top : self.count - bottom])[::-1], number, self)
        return super().page(number)

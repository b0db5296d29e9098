"""The triage desk's change list: the status filter with the two slices triage cares
about ("needs attention", "stale"), the flow-limit filter, and the counts per status."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.views.main import PAGE_VAR
from django.db.models import Count, Q, QuerySet
from django.http import HttpRequest
from django.utils.functional import Promise, cached_property
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from nexus_workflows import sql
from nexus_workflows.admin import counting, display
from nexus_workflows.admin.finding import SearchNotEchoedChangeList
from nexus_workflows.clock import DatabaseNow
from nexus_workflows.deferred import triage
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.unknown_kinds import due_of_unknown_kinds
from nexus_workflows.flow.report import waiting_on_limit_q
from nexus_workflows.models import DeferredWork, Status

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

#: Counted exactly on every list page: work that needs action, or will (partial indexes).
ACTION_STATUSES = (Status.PENDING, Status.PROCESSING, Status.ABANDONED)

#: Query-string value of the status filter that shows abandoned and stale work.
NEEDS_ATTENTION = "attention"
STALE = "stale"
WAITING_ON_A_LIMIT = "waiting"
#: Due work of kinds no runner of this project runs (it stays pending).
UNKNOWN_KIND = "unknown"
#: The status filter's values the summary counts (None: "all"); their lists take its count.
SUMMARISED = (None, NEEDS_ATTENTION, STALE, *Status.values)
#: The request attribute that carries a list's :meth:`TriageChangeList.summary_count`.
LIST_COUNTER = "_nexus_workflows_list_counter"


class StatusFilter(admin.SimpleListFilter):
    """Status, plus the two slices triage cares about: "needs attention" and "stale"."""

    title = _("status")
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, StrOrPromise]]:
        return [
            (NEEDS_ATTENTION, _("Needs attention")),
            (Status.PENDING.value, _("Pending")),
            (Status.PROCESSING.value, _("Processing")),
            (STALE, _("Processing, stale heartbeat")),
            (Status.DONE.value, _("Done")),
            (Status.ABANDONED.value, _("Abandoned")),
            (UNKNOWN_KIND, _("Due, kind not registered")),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[DeferredWork]) -> QuerySet[DeferredWork]:
        value = self.value()
        if value == NEEDS_ATTENTION:
            return queryset.filter(triage.needs_attention_q())
        if value == STALE:
            return queryset.filter(triage.stale_q())
        if value == UNKNOWN_KIND:
            kinds = list(due_of_unknown_kinds(DatabaseNow(), using=queryset.db))
            return queryset.filter(status=Status.PENDING, next_attempt_at__lte=DatabaseNow(), kind__in=kinds)
        if value in Status.values:
            return queryset.filter(status=value)
        return queryset


class FlowLimitFilter(admin.SimpleListFilter):
    """Due items that a flow limit (serial key, concurrency, rate) holds back."""

    title = _("flow control")
    parameter_name = "flow"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, StrOrPromise]]:
        return [(WAITING_ON_A_LIMIT, _("Waiting on a limit"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[DeferredWork]) -> QuerySet[DeferredWork]:
        if self.value() == WAITING_ON_A_LIMIT:
            return queryset.filter(waiting_on_limit_q(using=queryset.db))
        return queryset


class KindFilter(admin.AllValuesFieldListFilter):
    """Django's filter by kind (same URL parameters), listing the kinds this project
    registers and every kind stored, read from the dedupe constraint's index one probe per
    kind. Django's own listed them by a ``DISTINCT`` that read the whole table on
    PostgreSQL (60-120 ms at 300,000 rows)."""

    def __init__(
        self, field: Any, request: HttpRequest, params: Any, model: Any, model_admin: Any, field_path: str
    ) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)  # lazy: no query
        self.lookup_choices = stored_kinds(model_admin.get_queryset(request).order_by())  # type: ignore[assignment]


def stored_kinds(rows: QuerySet[DeferredWork]) -> list[str]:
    kinds = set(registry.kinds(deferred=True))
    # From the index that leads with the kind: MariaDB plans that for DISTINCT by itself,
    # PostgreSQL is asked for it.
    stored = getattr(sql.for_connection(rows.db), "distinct_kinds", None)
    kinds.update(stored(rows.db) if stored else rows.values_list("kind", flat=True).distinct())
    return sorted(kinds)


@dataclass(frozen=True)
class SummaryItem:
    value: str | None  # the status filter's value; None for "all"
    label: str | Promise
    count: int
    url: str
    active: bool
    tone: str
    #: The database's estimate, shown as "about" (done rows, and so "all", at scale).
    estimated: bool = False


class TriageChangeList(SearchNotEchoedChangeList):
    """The change list, minus the columns that may hold patient data, plus the counts
    per status of the current filter (kind included, status left out). Work is found by
    its dedupe key through the POSTed find box, never a ``?q=`` (see the admin's
    ``find_view``)."""

    def __init__(self, request: HttpRequest, *args: Any, **kwargs: Any) -> None:
        self.request = request
        if request.GET.get(StatusFilter.parameter_name) in SUMMARISED:
            # The paginator's count is one of the summary's (see get_paginator): not counted twice.
            setattr(request, LIST_COUNTER, self.summary_count)
        super().__init__(request, *args, **kwargs)
        status = self.params.get(StatusFilter.parameter_name)
        attention = status == NEEDS_ATTENTION
        # Translated per request, as Django translates its own title (a str).
        self.title = gettext("Deferred work that needs attention") if attention else gettext("Deferred work")

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[DeferredWork]:
        # Read where the page's snapshot is, filters' subqueries too (bound to their
        # queryset's database): a router may send each read to a replica of its choice
        # (Django's documented one picks at random). In the snapshot only: an action's
        # queryset, built after it, is the router's (its rows are read for writing).
        root = self.root_queryset
        if (snapshot := counting.snapshot_taken()) is not None:
            self.root_queryset = root.using(snapshot)
        try:
            queryset = super().get_queryset(request, exclude_parameters)
        finally:
            self.root_queryset = root
        # What no column shows stays in the database: the PHI-bearing JSON, and a task's
        # tracebacks and return value (up to 20,000 characters an attempt).
        return queryset.defer("trigger", "checkpoints", "history", "errors", "return_value")

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        if self.paginator.past_end:  # its last page was shown: the links say so
            self.page_num = self.paginator.num_pages
        # One read of the database's clock for the page's "ago", "due now" and "stale".
        display.read_now(request, list(self.result_list), self.queryset.db)
        self.status_counts  # noqa: B018 - read with the rows, in their snapshot (shown later)

    def summary_count(self) -> tuple[int, bool]:
        """The rows this list shows, ``(count, estimated)``: the summary's of its status."""
        return self.status_counts[self.params.get(StatusFilter.parameter_name)]

    @cached_property
    def unknown_kinds(self) -> list[tuple[str, int]]:
        """Due rows per kind that no runner of this project runs (every kind, whatever the
        filter: they need action), for the notice above the list."""
        found = due_of_unknown_kinds(DatabaseNow(), using=self.queryset.db)
        return list(found.items())

    @cached_property
    def unknown_kinds_url(self) -> str:
        return self.get_query_string({StatusFilter.parameter_name: UNKNOWN_KIND}, remove=[PAGE_VAR])

    @cached_property
    def status_counts(self) -> dict[str | None, tuple[int, bool]]:
        """``(count, estimated)`` per status filter value of the current filter (status left
        out; None: all). Pending, processing, stale and abandoned work is counted exactly;
        done work is the rest of the total, which is estimated when there is much of it (see
        :mod:`.counting`), and then says "about". Counted apart, each through its partial
        index, in the page's snapshot (``DeferredWorkAdmin.get_changelist_instance``); where
        there is none (SQLite), in one statement: counts taken apart by statements of their
        own disagree under a draining runner (a row counted pending, then processing)."""
        queryset = self.get_queryset(self.request, exclude_parameters=[StatusFilter.parameter_name])
        queryset = queryset.order_by()
        filtered = any(
            name.split("__")[0] in (FlowLimitFilter.parameter_name, "kind") for name in self.params
        )
        estimate = counting.large_estimate(queryset, filtered=filtered)
        estimated = estimate is not None
        if estimate is not None or counting.in_snapshot(queryset.db):
            # Each through its partial index (on MariaDB under a kind filter one statement
            # of them all read every row of the kind: 507 against 27 ms at 300,000 rows).
            exact = {status: queryset.filter(status=status).count() for status in ACTION_STATUSES}
            stale = queryset.filter(triage.stale_q()).count() if exact[Status.PROCESSING] else 0
            total = estimate if estimate is not None else queryset.count()
        else:
            exact, stale, total = _counted_at_once(queryset)
        # Done rows are the rest (four statuses), never a count of their own: on MariaDB
        # under a kind filter that read the whole table (160 ms at 300,000 rows).
        done = max(total - sum(exact.values()), 0)
        return {
            None: (sum(exact.values()) + done, estimated),
            NEEDS_ATTENTION: (exact[Status.ABANDONED] + stale, False),
            **{status.value: (exact[status], False) for status in ACTION_STATUSES},
            STALE: (stale, False),
            Status.DONE.value: (done, estimated),
        }

    @cached_property
    def status_summary(self) -> list[SummaryItem]:
        """The summary above the list: :attr:`status_counts`, each a link to its slice."""
        current = self.params.get(StatusFilter.parameter_name)

        def item(value: str | None, label: Promise, tone: str) -> SummaryItem:
            count, about = self.status_counts[value]
            if value is None:
                url = self.get_query_string(remove=[StatusFilter.parameter_name, PAGE_VAR])
            else:
                url = self.get_query_string({StatusFilter.parameter_name: value}, remove=[PAGE_VAR])
            return SummaryItem(value, label, count, url, current == value, tone if count else "none", about)

        return [
            item(None, _("All"), "all"),
            item(NEEDS_ATTENTION, _("Needs attention"), "attention"),
            item(Status.PENDING.value, _("Pending"), "pending"),
            item(Status.PROCESSING.value, _("Processing"), "processing"),
            item(STALE, _("Stale heartbeat"), "stale"),
            item(Status.DONE.value, _("Done"), "done"),
            item(Status.ABANDONED.value, _("Abandoned"), "abandoned"),
        ]


def _counted_at_once(rows: QuerySet[DeferredWork]) -> tuple[dict[Status, int], int, int]:
    """``(per action status, stale, total)`` of ``rows`` in one statement (conditional
    aggregates: ``FILTER`` on PostgreSQL and SQLite, ``CASE`` on MariaDB), so they agree."""
    figures = rows.aggregate(
        total=Count("pk"),
        stale=Count("pk", filter=triage.stale_q()),
        **{status.value: Count("pk", filter=Q(status=status)) for status in ACTION_STATUSES},
    )
    return {status: figures[status.value] for status in ACTION_STATUSES}, figures["stale"], figures["total"]

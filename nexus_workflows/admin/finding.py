"""Admin lists whose search term is patient data (a conversation code, a dedupe key): the
term is never echoed back, never carried in a URL (access logs and browser history would
keep it), and each find is in the admin log, without the term."""

from __future__ import annotations

import copy
from typing import Any

from django.contrib import messages
from django.contrib.admin.options import (
    IS_FACETS_VAR,  # also in views.main, but not in its stubs
    IncorrectLookupParameters,
)
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR, ChangeList
from django.core.exceptions import PermissionDenied, SuspiciousOperation
from django.db.models import Model, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect, QueryDict
from django.urls import URLPattern, path, reverse
from django.utils.functional import Promise
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from nexus_workflows.admin.reveal import hides_patient_data, staff_user_pk


class SearchNotEchoedChangeList(ChangeList):
    """A change list that never shows what was typed into its search box (a conversation
    code, a dedupe key: patient data): the box is left empty, and the term is not carried
    into links."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.query = ""
        self.params.pop(SEARCH_VAR, None)  # sort, filter and page links drop it too
        self.filter_params.pop(SEARCH_VAR, None)
        self.remove_facet_link = self.get_query_string(remove=[IS_FACETS_VAR])
        self.add_facet_link = self.get_query_string({IS_FACETS_VAR: True})


class SearchNotEchoedMixin:
    """A list whose search term is never echoed back into the page or its links: see
    :class:`SearchNotEchoedChangeList`."""

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return SearchNotEchoedChangeList

    def get_preserved_filters(self, request: HttpRequest) -> str:
        preserved = super().get_preserved_filters(request)  # type: ignore[misc]
        if not preserved:
            return preserved
        # The typed term must not travel on into the change page's links.
        filters = QueryDict(QueryDict(preserved).get("_changelist_filters", ""), mutable=True)
        filters.pop(SEARCH_VAR, None)
        return urlencode({"_changelist_filters": filters.urlencode()}) if filters else ""


#: The list's filters, POSTed beside the term by the find box (``find_box.html``).
FILTERS_FIELD = "_changelist_filters"


class FindByPostMixin(SearchNotEchoedMixin):
    """The list's search box POSTs what was typed (field :attr:`find_field`) and the list's
    filters to :meth:`find_view`, which goes to the page of what :meth:`find_objects` found
    among the rows those filters show, as Django's own search looks only within them (the
    first, when several), or back to the filtered list saying nothing was found. Each object
    found gets an admin-log entry, :attr:`find_logged`; a term that finds nothing gets one on
    the model, :attr:`find_nothing_logged`. A typed ``?q=`` finds nothing."""

    find_field: str
    find_not_found: str | Promise
    find_logged: str | Promise
    find_nothing_logged: str | Promise = _("Looked for by a term that found nothing (nothing was changed).")

    def find_objects(self, typed: str, listed: QuerySet[Any]) -> list[Model]:
        """What ``typed`` finds among ``listed``, the rows the list's filters show."""
        raise NotImplementedError

    def find_many_message(self, found: list[Model]) -> str | None:
        """What to say when several objects were found (the first is shown)."""
        return None

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts  # type: ignore[attr-defined]
        # The typed term is in the POST data and the frames' variables: kept out of error reports.
        view = self.admin_site.admin_view(hides_patient_data(self.find_view))  # type: ignore[attr-defined]
        # Before the admin's own "<path:object_id>/", which would take "find/" for an id.
        find = path("find/", view, name=f"{opts.app_label}_{opts.model_name}_find")
        return [find, *super().get_urls()]  # type: ignore[misc]

    def find_view(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_view_or_change_permission(request):  # type: ignore[attr-defined]
            raise PermissionDenied
        typed = request.POST.get(self.find_field, "")
        filters = self._list_filters(request)
        found = self.find_objects(typed, self._listed(request, filters)) if typed else []
        site, opts = self.admin_site.name, self.opts  # type: ignore[attr-defined]
        if not found:
            if typed:  # a probe is audited too: who looked for which patients is the record
                self._log_find_of_nothing(request)
            self.message_user(request, self._not_found_message(filters), messages.WARNING)  # type: ignore[attr-defined]
            changelist = reverse(f"{site}:{opts.app_label}_{opts.model_name}_changelist")
            return HttpResponseRedirect(f"{changelist}?{filters.urlencode()}" if filters else changelist)
        for obj in found:  # that something exists for the term (a patient) is patient data
            self.log_change(request, obj, str(self.find_logged))  # type: ignore[attr-defined]
        if len(found) > 1 and (many := self.find_many_message(found)):
            self.message_user(request, many, messages.INFO)  # type: ignore[attr-defined]
        change = reverse(f"{site}:{opts.app_label}_{opts.model_name}_change", args=[found[0].pk])
        if filters:  # the page's way back leads to the list as it was filtered
            change = f"{change}?{urlencode({FILTERS_FIELD: filters.urlencode()})}"
        return HttpResponseRedirect(change)

    def _list_filters(self, request: HttpRequest) -> QueryDict:
        """The list's filters the box was sent from, without a search term or a page."""
        filters = QueryDict(request.POST.get(FILTERS_FIELD, ""), mutable=True)
        for name in (SEARCH_VAR, PAGE_VAR):
            filters.pop(name, None)
        return filters

    def _listed(self, request: HttpRequest, filters: QueryDict) -> QuerySet[Any]:
        """The rows the list shows with ``filters``, through the list's own filtering (so a
        filter the list refuses is refused here too: Django's 400)."""
        listing = copy.copy(request)
        listing.GET = QueryDict(filters.urlencode())  # immutable, as a request's own
        try:
            changelist = self.get_changelist_instance(listing)  # type: ignore[attr-defined]
        except IncorrectLookupParameters as refused:
            raise SuspiciousOperation("The list's filters were refused.") from refused
        return changelist.queryset

    def _not_found_message(self, filters: QueryDict) -> str:
        if not filters:
            return str(self.find_not_found)
        return f"{self.find_not_found} {_('Only what the list shows with its filters was looked at.')}"

    def _log_find_of_nothing(self, request: HttpRequest) -> None:
        """An admin-log entry on the list's model, with no object (none was found) and never
        the term: Django's ``log_change`` needs an object."""
        from django.contrib.admin.models import CHANGE, LogEntry  # models: as Django's admin does
        from django.contrib.contenttypes.models import ContentType

        LogEntry.objects.create(
            user_id=staff_user_pk(request),
            content_type=ContentType.objects.get_for_model(self.model),  # type: ignore[attr-defined]
            object_id=None,
            object_repr=str(self.find_nothing_logged)[:200],
            action_flag=CHANGE,
            change_message=str(self.find_nothing_logged),
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        # Found only through the POSTed box: a term in a GET URL would reach access logs
        # and browser history.
        return (queryset.none() if search_term else queryset), False

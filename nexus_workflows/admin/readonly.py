"""Read-only admin pages: the app writes these rows, never a person through a form."""

from __future__ import annotations

from typing import Any, ClassVar

from django.contrib.admin.options import IncorrectLookupParameters
from django.http import HttpRequest

from nexus_workflows.json_values import text_problem


class ReadOnlyAdminMixin:
    """No add and no change, for a ``ModelAdmin`` or an inline; delete as the class says.

    ``deletable`` is False where deleting a row by hand would break what depends on it
    (a token map's tokens decode text already sent out; a runner's row is purged after
    ``RETENTION``); otherwise delete keeps Django's permission check.
    """

    deletable: bool = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.deletable and super().has_delete_permission(request, obj)  # type: ignore[misc]


class ListedFiltersOnlyMixin:
    """Filters in a list's URL only on what the list offers (its ``list_filter``).

    Django's admin accepts a filter on any field of the model itself, JSON keys included
    (``?trigger__patient__icontains=mar``): the row count then answers whether a guess
    about a trigger, an error or a key was right, letter by letter, with view permission
    alone, no reveal and no audit. Anything else gets Django's 400.

    A value no column can hold (a NUL character, a lone surrogate) gets Django's "invalid
    filter" redirect (``?e=1``), as other bad lookups do: PostgreSQL refuses to even
    compare with it, which was a server error (500).
    """

    list_filter: ClassVar[Any]

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        for _name, values in request.GET.lists():
            if any(text_problem(value) for value in values):
                # Never the value: it may be patient data typed into a URL.
                raise IncorrectLookupParameters("a filter's value cannot be stored in any column")
        return super().get_changelist_instance(request)  # type: ignore[misc]

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        return lookup in listed_lookups(self.list_filter)


def listed_lookups(list_filter: Any) -> set[str]:
    """The URL parameters of ``list_filter``: a custom filter's ``parameter_name``; for a
    field, the lookups Django's own field filters write."""
    allowed: set[str] = set()
    for item in list_filter:
        field = item[0] if isinstance(item, list | tuple) else item
        if isinstance(field, str):
            allowed |= {field, f"{field}__exact", f"{field}__isnull", f"{field}__id__exact"}
        elif getattr(field, "parameter_name", None):
            allowed.add(field.parameter_name)
    return allowed

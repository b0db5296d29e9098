"""Read-only admin pages: the app writes these rows, never a person through a form."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest


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

"""Minimum necessary in the admin: patient data behind a permission, a POST and an audit line.

Pages that may hold patient data (a PHI token's surface, a deferred work's trigger,
checkpoints and error messages) are never part of a list or detail page. A user with the
model admin's reveal permission sees them on a dedicated page:

- ``GET <id>/reveal/`` asks for confirmation and shows nothing;
- ``POST <id>/reveal/`` (from that page or a button on the detail page) shows the data,
  writes one admin log entry (who, when, which object — never the data itself) and is
  sent with ``Cache-Control: no-store`` so no browser or proxy keeps a copy.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.cache import add_never_cache_headers
from django.utils.functional import Promise
from django.utils.translation import gettext
from django.views.decorators.debug import sensitive_post_parameters, sensitive_variables

#: Shows a workflow's patient data: deferred work's, and fire-and-forget jobs' (admin.jobs).
REVEAL_WORKFLOW_DATA = "nexus_workflows.reveal_deferredwork"


def hides_patient_data(view: Any) -> Any:
    """``view`` with the POST data and every frame's variables (its own and what it calls,
    SQL parameters included) left out of Django's error reports (``DEBUG`` off): the
    e-mail ``AdminEmailHandler`` sends, or a tracker built on Django's reporter, must not
    carry a typed key or a revealed value."""
    return sensitive_post_parameters()(sensitive_variables()(view))


def staff_user_pk(request: HttpRequest) -> int | str:
    """Who an admin log entry is by: the admin site serves staff users only, never
    ``AnonymousUser`` (whose pk is None). An int for Django's ``User``."""
    return cast("int | str", request.user.pk)


def missing_object_redirect(model_admin: Any, request: HttpRequest, object_id: str) -> HttpResponse:
    """What Django's admin does for an object that does not exist (say, deleted meanwhile),
    through public API: a warning and the admin index (Django's own helper,
    ``ModelAdmin._get_obj_does_not_exist_redirect``, is private)."""
    # Django's own msgid (curly quotes and all), so its translations apply.
    message = gettext("%(name)s with ID “%(key)s” doesn’t exist. Perhaps it was deleted?") % {  # noqa: RUF001
        "name": model_admin.opts.verbose_name,
        "key": unquote(object_id),
    }
    model_admin.message_user(request, message, messages.WARNING)
    return HttpResponseRedirect(reverse("admin:index", current_app=model_admin.admin_site.name))


class RevealFailed(Exception):
    """The data cannot be shown (say, a surface that no key decrypts); the message is shown."""


class RevealMixin:
    """For a ``ModelAdmin``: a reveal page behind ``reveal_permission``, audited.

    Subclasses set ``reveal_permission`` ("app_label.codename"), ``reveal_template`` (which
    extends ``admin/nexus_workflows/reveal.html``) and ``reveal_what`` (words for the page),
    and implement :meth:`reveal_payload`.
    """

    reveal_permission: str
    reveal_template: str
    reveal_what: str | Promise

    def has_reveal_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(self.reveal_permission) and self.has_view_permission(  # type: ignore[attr-defined]
            request, obj
        )

    def reveal_payload(self, request: HttpRequest, obj: Any) -> dict[str, Any]:
        """The template context that shows the data; may raise :class:`RevealFailed`."""
        raise NotImplementedError

    def reveal_log_message(self, obj: Any) -> str:
        return gettext("Revealed the %(what)s of %(object)s (nothing was changed).") % {
            "what": self.reveal_what,
            "object": obj,
        }

    def reveal_url(self, obj: Any) -> str:
        opts = self.opts  # type: ignore[attr-defined]
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_reveal",
            args=[obj.pk],
            current_app=self.admin_site.name,  # type: ignore[attr-defined]
        )

    def get_urls(self) -> list[URLPattern]:
        opts = self.opts  # type: ignore[attr-defined]
        return [
            path(
                "<path:object_id>/reveal/",
                self.admin_site.admin_view(hides_patient_data(self.reveal_view)),  # type: ignore[attr-defined]
                name=f"{opts.app_label}_{opts.model_name}_reveal",
            ),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def reveal_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        admin: Any = self
        obj = admin.get_object(request, unquote(object_id))
        if obj is None:
            return missing_object_redirect(admin, request, object_id)
        if not self.has_reveal_permission(request, obj):
            raise PermissionDenied
        payload: dict[str, Any] | None = None
        if request.method == "POST":
            try:
                payload = self.reveal_payload(request, obj)
            except RevealFailed as error:
                admin.message_user(request, str(error), messages.ERROR)
                opts = admin.opts
                return HttpResponseRedirect(
                    reverse(
                        f"admin:{opts.app_label}_{opts.model_name}_change",
                        args=[obj.pk],
                        current_app=admin.admin_site.name,
                    )
                )
            admin.log_change(request, obj, self.reveal_log_message(obj))
        context = {
            **admin.admin_site.each_context(request),
            "title": gettext("Reveal the %(what)s of %(object)s") % {"what": self.reveal_what, "object": obj},
            "opts": admin.opts,
            "original": obj,
            "reveal_what": self.reveal_what,
            "revealed": payload is not None,
            **(payload or {}),
        }
        return private(TemplateResponse(request, self.reveal_template, context))


def private(response: TemplateResponse) -> HttpResponse:
    """A reveal page's response: ``no-store`` (no browser or proxy keeps a copy of what
    was shown) and never inside another site's frame (its button must not be clicked
    through one), whatever middleware the project has.

    Rendered here, inside the view (see :func:`hides_patient_data`): rendered later, by
    Django's handler, a failure's report would show the template frames' context, the
    revealed data included."""
    response.render()
    add_never_cache_headers(response)
    response["X-Frame-Options"] = "DENY"
    return response

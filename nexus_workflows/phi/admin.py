"""Admin for PHI token maps: codes, counts and tokens, never surfaces.

Maps and tokens are read-only: tokens are made by ``encode`` alone. A surface is shown
only on a dedicated page, to users with the ``reveal_phitoken`` permission, after a POST,
and every reveal is written to the admin log (the token's history) — never the surface.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.cache import add_never_cache_headers

from .exceptions import SurfaceDecryptionError
from .keys import keyring
from .models import PhiToken, TokenMap

REVEAL_PERMISSION = "nexus_workflows.reveal_phitoken"


class PhiTokenInline(admin.TabularInline):
    model = PhiToken
    fields = ("token", "category", "created_at", "updated_at")
    readonly_fields = fields
    ordering = ("number",)
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(TokenMap)
class TokenMapAdmin(admin.ModelAdmin):
    list_display = ("code", "token_count", "sequence", "created_at", "updated_at")
    search_fields = ("code",)
    ordering = ("-updated_at",)
    fields = ("code", "token_count", "sequence", "created_at", "updated_at")
    readonly_fields = fields
    inlines = (PhiTokenInline,)

    def get_queryset(self, request: HttpRequest) -> QuerySet[TokenMap]:
        return super().get_queryset(request).annotate(_token_count=Count("tokens"))

    @admin.display(description="tokens", ordering="_token_count")
    def token_count(self, token_map: TokenMap) -> int:
        return token_map._token_count  # type: ignore[attr-defined]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(PhiToken)
class PhiTokenAdmin(admin.ModelAdmin):
    list_display = ("token", "category", "token_map", "created_at", "updated_at")
    list_filter = ("category",)
    # Tokens and codes only: surfaces are encrypted and must never be searchable.
    search_fields = ("token", "token_map__code")
    list_select_related = ("token_map",)
    ordering = ("token_map", "number")
    fields = ("token_map", "token", "category", "number", "created_at", "updated_at")
    readonly_fields = fields
    change_form_template = "admin/nexus_workflows/phitoken/change_form.html"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A token goes with its map; deleting one alone would leave text undecodable.
        return False

    def has_reveal_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(REVEAL_PERMISSION) and self.has_view_permission(request, obj)

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "<path:object_id>/reveal/",
                self.admin_site.admin_view(self.reveal_view),
                name="{}_{}_reveal".format(*info),
            ),
            *super().get_urls(),
        ]

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        extra_context = {**(extra_context or {}), "can_reveal_surface": self.has_reveal_permission(request)}
        return super().change_view(request, object_id, form_url, extra_context)

    def reveal_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        token = self.get_object(request, unquote(object_id))
        if token is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_reveal_permission(request, token):
            raise PermissionDenied
        surface = None
        if request.method == "POST":
            try:
                surface = keyring().decrypt(token.lookup_key, token.encrypted_surface, label=str(token))
            except SurfaceDecryptionError as error:
                self.message_user(request, str(error), messages.ERROR)
                return HttpResponseRedirect(
                    reverse(f"{self.admin_site.name}:nexus_workflows_phitoken_change", args=[token.pk])
                )
            self.log_change(request, token, f"Revealed the surface of {token} (nothing was changed).")
        context = {
            **self.admin_site.each_context(request),
            "title": f"Reveal the surface of {token}",
            "opts": self.opts,
            "original": token,
            "surface": surface,
        }
        response = TemplateResponse(request, "admin/nexus_workflows/phitoken/reveal_surface.html", context)
        add_never_cache_headers(response)
        return response

"""Admin for PHI token maps: maps by id, counts and tokens; never codes or surfaces.

Maps and tokens are read-only and cannot be deleted here: tokens are made by ``encode``
alone, and a deleted map would leave text already sent out undecodable. A map is found by
typing its conversation code exactly (it is looked up by the code's keyed hash and never
echoed back). A surface is shown only on a dedicated page, to users with the
``reveal_phitoken`` permission, after a POST, and every reveal is written to the admin
log (the token's history) — never the surface (see :mod:`nexus_workflows.admin.reveal`).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from nexus_workflows.admin.finding import FindByPostMixin, SearchNotEchoedMixin
from nexus_workflows.admin.readonly import ListedFiltersOnlyMixin, ReadOnlyAdminMixin
from nexus_workflows.admin.reveal import RevealFailed, RevealMixin
from nexus_workflows.phi.exceptions import PhiError, SurfaceDecryptionError
from nexus_workflows.phi.keys import code_hash, keyring
from nexus_workflows.phi.models import PhiToken, TokenMap
from nexus_workflows.phi.tokens import check_code

REVEAL_PERMISSION = "nexus_workflows.reveal_phitoken"


class PhiTokenInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = PhiToken
    fields = ("token", "category", "created_at", "updated_at")
    readonly_fields = fields
    ordering = ("number",)
    extra = 0
    can_delete = False
    show_change_link = True


@admin.register(TokenMap)
class TokenMapAdmin(ReadOnlyAdminMixin, ListedFiltersOnlyMixin, FindByPostMixin, admin.ModelAdmin):
    list_display = ("map_column", "token_count", "sequence", "created_at", "updated_at")
    # Searched by the code's keyed hash (see get_search_results): exact codes only.
    search_fields = ("code_hash",)
    search_help_text = _(
        "Type a conversation code exactly to go to its map. Codes are stored only as keyed "
        "hashes, so parts of a code find nothing; the code is not kept in any URL."
    )
    # Deleting a map deletes its tokens: text already sent out could never be decoded.
    deletable = False
    ordering = ("-updated_at",)
    fields = ("map_column", "token_count", "sequence", "created_at", "updated_at")
    readonly_fields = fields
    inlines = (PhiTokenInline,)

    def get_queryset(self, request: HttpRequest) -> QuerySet[TokenMap]:
        return super().get_queryset(request).annotate(_token_count=Count("tokens"))

    change_list_template = "admin/nexus_workflows/tokenmap/change_list.html"

    # The search box (FindByPostMixin): that a code has a conversation (a phone number is a
    # patient) is itself patient data.
    find_field = "code"
    find_not_found = _("No token map has that conversation code.")
    find_logged = _("Found by its conversation code (nothing was changed).")
    find_nothing_logged = _("Looked for by a conversation code that no map has (nothing was changed).")

    def find_objects(self, typed: str, listed: QuerySet[Any]) -> list[Any]:
        """The map of exactly this code, by its keyed hash: only hashes are stored, so part
        of a code finds nothing."""
        try:
            hashed = code_hash(check_code(typed))
        except PhiError:  # not a possible code, or the keys are not configured
            return []
        return list(listed.filter(code_hash=hashed)[:1])

    @admin.display(description=_("token map"), ordering="pk")
    def map_column(self, token_map: TokenMap) -> str:
        return str(token_map)

    @admin.display(description=_("tokens"), ordering="_token_count")
    def token_count(self, token_map: TokenMap) -> int:
        return token_map._token_count  # type: ignore[attr-defined]


@admin.register(PhiToken)
class PhiTokenAdmin(
    ReadOnlyAdminMixin, ListedFiltersOnlyMixin, RevealMixin, SearchNotEchoedMixin, admin.ModelAdmin
):
    list_display = ("token", "category", "map_column", "created_at", "updated_at")
    list_filter = ("category",)
    # Tokens, and maps by their exact code (hashed): surfaces are encrypted and must never
    # be searchable.
    search_fields = ("token",)
    search_help_text = _(
        "Search by token. To find a conversation's tokens, find its map by code under PHI token maps."
    )
    # A token goes with its map; deleting one alone would leave text undecodable.
    deletable = False
    ordering = ("token_map", "number")
    fields = ("token_map", "token", "category", "number", "created_at", "updated_at")
    readonly_fields = fields
    change_form_template = "admin/nexus_workflows/phitoken/change_form.html"
    reveal_permission = REVEAL_PERMISSION
    reveal_template = "admin/nexus_workflows/phitoken/reveal_surface.html"
    reveal_what = _("surface")

    @admin.display(description=_("token map"), ordering="token_map")
    def map_column(self, token: PhiToken) -> str:
        return gettext("token map #%(id)s") % {"id": token.token_map_id}

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        extra_context = {**(extra_context or {}), "can_reveal_surface": self.has_reveal_permission(request)}
        return super().change_view(request, object_id, form_url, extra_context)

    def reveal_payload(self, request: HttpRequest, token: PhiToken) -> dict[str, Any]:
        try:
            surface = keyring().decrypt(token.lookup_key, token.encrypted_surface, label=str(token))
        except SurfaceDecryptionError as error:
            raise RevealFailed(str(error)) from None
        return {"surface": surface}

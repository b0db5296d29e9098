"""The operator's pages in the admin: the runners (read-only) and the dashboard."""

from __future__ import annotations

from datetime import datetime

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from nexus_workflows.admin import display as display
from nexus_workflows.admin.readonly import ListedFiltersOnlyMixin, ReadOnlyAdminMixin
from nexus_workflows.clock import DatabaseNow
from nexus_workflows.models import DeferredWork
from nexus_workflows.observability import dashboard
from nexus_workflows.observability.models import Runner
from nexus_workflows.observability.runners import with_liveness


@admin.register(Runner)
class RunnerAdmin(ReadOnlyAdminMixin, ListedFiltersOnlyMixin, admin.ModelAdmin):
    """``runworkflows`` processes as the database last saw them. Rows are written by the
    runners themselves; a runner not seen for ``STALE_AFTER`` is shown dead."""

    list_display = (
        "runner_column",
        "state_column",
        "kinds_column",
        "concurrency",
        "in_flight_column",
        "done",
        "failed",
        "started_column",
        "last_seen_column",
        "version",
    )
    list_display_links = None
    deletable = False  # dead runners' rows are purged after RETENTION
    ordering = ("-last_seen_at", "-pk")
    list_per_page = 100

    class Media:
        css = {"all": ("nexus_workflows/admin/triage.css",)}

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        context = {"title": _("Runners"), "subtitle": None, **(extra_context or {})}
        return super().changelist_view(request, context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Runner]:
        # Each row carries the database's now, read by the list's own query: "ago" by the
        # database's clock (README "One clock") without a query per row.
        now = {display.NOW_ATTRIBUTE: DatabaseNow()}
        return with_liveness(super().get_queryset(request)).annotate(**now)

    @admin.display(description=_("runner"), ordering="host")
    def runner_column(self, runner: Runner) -> str:
        return f"{runner.host} pid {runner.pid}"

    @admin.display(description=_("state"), ordering="last_seen_at")
    def state_column(self, runner: Runner) -> SafeString:
        if getattr(runner, "alive", False):
            return format_html('<span class="nw-badge nw-badge--done">{}</span>', _("alive"))
        return format_html(
            '<span class="nw-badge nw-badge--abandoned" title="{}">{}</span>',
            _("Not seen for longer than STALE_AFTER: the process died or lost the database"),
            _("dead"),
        )

    @admin.display(description=_("in flight"), ordering="in_flight")
    def in_flight_column(self, runner: Runner) -> SafeString | int:
        if getattr(runner, "alive", False):
            return runner.in_flight
        # A dead runner runs nothing: its count is what it ran when last seen, which live
        # runners take over (stale claims). Shown plainly, it read as work still running.
        return format_html(
            '<span class="nw-muted" title="{}">— ({})</span>',
            _("A dead runner runs nothing; in brackets, what it ran when last seen"),
            runner.in_flight,
        )

    @admin.display(description=_("kinds"))
    def kinds_column(self, runner: Runner) -> str:
        return ", ".join(runner.kinds) if runner.kinds else gettext("(none)")

    @admin.display(description=_("started"), ordering="started_at")
    def started_column(self, runner: Runner) -> SafeString:
        return display.when(runner.started_at, now=_database_now(runner), compact=True)

    @admin.display(description=_("last seen"), ordering="last_seen_at")
    def last_seen_column(self, runner: Runner) -> SafeString:
        return display.when(runner.last_seen_at, now=_database_now(runner), compact=True)


def _database_now(runner: Runner) -> datetime | None:
    """The database's now the list's query read with ``runner`` (None elsewhere: ``when``
    then reads it itself)."""
    return getattr(runner, display.NOW_ATTRIBUTE, None)


def dashboard_view(model_admin: admin.ModelAdmin, request: HttpRequest) -> HttpResponse:
    """Per kind: outcomes per 5 minutes over 24 hours, pending depth, oldest due age."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    board = dashboard.build(router.db_for_read(DeferredWork))
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Workflow dashboard"),
        "subtitle": None,
        "opts": model_admin.opts,
        "board": board,
        "legend": dashboard.legend(),
    }
    return TemplateResponse(request, "admin/nexus_workflows/dashboard.html", context)

"""The admin triage desk for deferred work: see what is wrong and why, and revive it.

Rows are never added or edited by hand. Reviving abandoned work and making pending work
due now need the dedicated ``nexus_workflows.revive_deferredwork`` permission ("change"
is not enough), and every such action leaves an admin log entry naming the user.

Minimum necessary: the dedupe key, the trigger, the checkpoints and error messages may
hold patient data. List and detail pages show kind, id, status, attempts, times and the
exception *type* only. Users with ``nexus_workflows.reveal_deferredwork`` see the rest
after a POST from the detail page, audited (see :mod:`nexus_workflows.admin.reveal`), if
they may view deferred work too; the same two permissions open a fire-and-forget job's
sealed trigger and error message (:mod:`nexus_workflows.admin.jobs`).
Work is found by typing its dedupe key exactly. Deleting selected work always goes
through a confirmation page that says what will be lost.
"""

# Long module: one ModelAdmin: its columns, detail fields, actions and buttons.

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.actions import delete_selected as django_delete_selected
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from nexus_workflows import json_values, sql
from nexus_workflows.admin import display as display
from nexus_workflows.admin import jobs
from nexus_workflows.admin.actions import (
    MADE_DUE,
    REVIVED,
    ResultWording,
    count_gone,
    delete_summary,
    describe_losses,
    describe_result,
    is_confirmed,
    sign_confirmation,
)
from nexus_workflows.admin.changelist import (
    LIST_COUNTER,
    FlowLimitFilter,
    KindFilter,
    StatusFilter,
    TriageChangeList,
)
from nexus_workflows.admin.counting import EstimatingPaginator, one_snapshot, page_wanted
from nexus_workflows.admin.finding import FindByPostMixin
from nexus_workflows.admin.readonly import ListedFiltersOnlyMixin, ReadOnlyAdminMixin
from nexus_workflows.admin.reveal import (
    REVEAL_WORKFLOW_DATA,
    RevealMixin,
    hides_patient_data,
    missing_object_redirect,
    staff_user_pk,
)
from nexus_workflows.deferred import triage
from nexus_workflows.fire_and_forget.job import REVEAL_URL_NAME
from nexus_workflows.flow.report import waiting_reason
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.observability import admin as observability_admin  # registers the runners' admin
from nexus_workflows.phi import admin as phi_admin  # noqa: F401 - registers the PHI token map admin

REVIVE_PERMISSION = "nexus_workflows.revive_deferredwork"
REVEAL_PERMISSION = REVEAL_WORKFLOW_DATA


@admin.register(DeferredWork)
class DeferredWorkAdmin(
    ReadOnlyAdminMixin, ListedFiltersOnlyMixin, FindByPostMixin, RevealMixin, admin.ModelAdmin
):
    """Work is created by enqueue() and changes only through the runner and the triage
    actions (read-only otherwise); deleting goes through a confirmation page."""

    list_display = (
        "id_column",
        "kind",
        "status_column",
        "attempts_column",
        "next_attempt_column",
        "error_type_column",
        "updated_column",
    )
    list_display_links = ("id_column",)
    list_filter = (StatusFilter, FlowLimitFilter, ("kind", KindFilter))
    # Found through find_view only: exactly (a partial search would tell which keys
    # contain what was typed), and never from a URL (see get_search_results).
    search_fields = ("=dedupe_key",)
    search_help_text = _(
        "Type a dedupe key exactly to go to its work; the key is not kept in any URL. "
        "Triggers, checkpoints and errors are not searchable."
    )
    # Newest first by the primary key, which its index serves: no index on created_at
    # (each index costs every enqueue), and ordering by it sorted the whole table.
    ordering = ("-pk",)
    list_per_page = 50
    # At scale: no count of the whole table on filtered pages, and a page's total is the
    # database's estimate past counting.EXACT_UP_TO rows, "about" (see get_paginator).
    paginator = EstimatingPaginator
    show_full_result_count = False
    actions = ("revive_selected", "run_selected_now", "delete_selected")
    readonly_fields = (
        "status_column",
        "kind",
        "attempts_column",
        "next_attempt_detail",
        "created_column",
        "updated_detail",
        "error_type_detail",
        "history_table",
        "claim_token",
        "claimed_column",
        "heartbeat_column",
        "queue_name",
        "priority",
        "backend_name",
        "started_column",
        "finished_column",
        "worker_ids_list",
        "error_types_list",
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("status_column", "attempts_column", "next_attempt_detail"),
                    ("kind", "created_column", "updated_detail"),
                )
            },
        ),
        (
            _("Last error"),
            {
                "fields": ("error_type_detail",),
                "description": _(
                    "The exception type. Its message, the dedupe key, the trigger and the "
                    "checkpoints may hold patient data: they are revealed on request (see above)."
                ),
            },
        ),
        (_("Attempt history"), {"fields": ("history_table",)}),
        (
            _("Django task"),
            {
                "fields": (
                    ("queue_name", "priority", "backend_name"),
                    ("started_column", "finished_column"),
                    "worker_ids_list",
                    "error_types_list",
                ),
                "description": _(
                    "For a task enqueued through Django's Tasks API (its kind is the "
                    "task's import path; the dedupe key is its result id). Its return value and "
                    "tracebacks may hold patient data: they are revealed on request (see above)."
                ),
                "classes": ("collapse",),
            },
        ),
        (
            _("Claim"),
            {"fields": ("claim_token", "claimed_column", "heartbeat_column"), "classes": ("collapse",)},
        ),
    )
    change_list_template = "admin/nexus_workflows/deferredwork/change_list.html"
    change_form_template = "admin/nexus_workflows/deferredwork/change_form.html"
    delete_confirmation_template = "admin/nexus_workflows/deferredwork/delete_confirmation.html"

    class Media:
        css = {"all": ("nexus_workflows/admin/triage.css",)}

    # --- permissions --------------------------------------------------------------------

    def has_revive_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(REVIVE_PERMISSION)

    # The reveal page (admin_reveal.RevealMixin): GET confirms, POST shows and logs.
    reveal_permission = REVEAL_PERMISSION
    reveal_template = "admin/nexus_workflows/deferredwork/reveal.html"
    reveal_what = _("dedupe key, trigger, checkpoints and error messages (a task's: and its return value)")

    def reveal_payload(self, request: HttpRequest, work: DeferredWork) -> dict[str, Any]:
        return {
            "last_error": display.error_block(work.last_error),
            "history": render_to_string(
                "admin/nexus_workflows/deferredwork/history.html",
                {"rows": display.history_rows(work, reveal=True)},
            ),
            "trigger": display.json_block(work.trigger, empty="No trigger."),
            "checkpoints": display.json_block(work.checkpoints, empty="No checkpoints saved yet."),
            # Django tasks (nexus_workflows.tasks) only.
            "is_task": bool(work.queue_name),
            "return_value": display.json_block(work.return_value, empty="None."),
            "errors": display.json_block(work.errors, empty="No errors."),
        }

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return TriageChangeList

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        # The list's counts, its page's total and its rows in one snapshot, so that they
        # agree while runners drain (see counting.one_snapshot); actions run after it.
        with one_snapshot(router.db_for_read(self.model)):
            return super().get_changelist_instance(request)

    def get_paginator(
        self, request: HttpRequest, queryset: Any, per_page: int, *args: Any, **kwargs: Any
    ) -> EstimatingPaginator:
        paginator = EstimatingPaginator(queryset, per_page, *args, **kwargs)
        # The summary's count when it has this list's (TriageChangeList), and the page asked for.
        paginator.counter = getattr(request, LIST_COUNTER, None)
        paginator.wanted = page_wanted(request)
        # Only the unfiltered list and done work are estimated; what needs action is counted.
        status = request.GET.get(StatusFilter.parameter_name)
        paginator.exact = status not in (None, Status.DONE.value)
        filters = (StatusFilter.parameter_name, FlowLimitFilter.parameter_name, "kind")
        paginator.filtered = any(name.split("__")[0] in filters for name in request.GET)
        return paginator

    # --- list columns -------------------------------------------------------------------

    @admin.display(description=_("ID"), ordering="pk")
    def id_column(self, work: DeferredWork) -> str:
        return f"#{work.pk}"

    @admin.display(description=_("status"), ordering="status")
    def status_column(self, work: DeferredWork) -> SafeString:
        return display.status_badge(work)

    @admin.display(description=_("attempt"), ordering="attempt")
    def attempts_column(self, work: DeferredWork) -> SafeString:
        return display.attempts(work)

    @admin.display(description=_("next attempt"), ordering="next_attempt_at")
    def next_attempt_column(self, work: DeferredWork) -> SafeString:
        return display.next_attempt(work, compact=True)

    @admin.display(description=_("next attempt"))
    def next_attempt_detail(self, work: DeferredWork) -> SafeString:
        return display.next_attempt(work)

    @admin.display(description=_("last error"))
    def error_type_column(self, work: DeferredWork) -> SafeString:
        return display.error_type_badge(work.last_error)

    @admin.display(description=_("last update"), ordering="updated_at")
    def updated_column(self, work: DeferredWork) -> SafeString:
        return display.when(work.updated_at, now=display.now_of(work), compact=True)

    @admin.display(description=_("last update"))
    def updated_detail(self, work: DeferredWork) -> SafeString:
        return display.when(work.updated_at, now=display.now_of(work))

    # --- detail fields ------------------------------------------------------------------

    @admin.display(description=_("created"))
    def created_column(self, work: DeferredWork) -> SafeString:
        return display.when(work.created_at, now=display.now_of(work))

    @admin.display(description=_("claimed at"))
    def claimed_column(self, work: DeferredWork) -> SafeString:
        return display.when(work.claimed_at, now=display.now_of(work))

    @admin.display(description=_("last heartbeat"))
    def heartbeat_column(self, work: DeferredWork) -> SafeString:
        return display.when(work.heartbeat_at, now=display.now_of(work))

    @admin.display(description=_("exception type"))
    def error_type_detail(self, work: DeferredWork) -> SafeString:
        if not work.last_error:
            return format_html('<p class="nw-muted">{}</p>', _("No error recorded."))
        return display.error_type_badge(work.last_error)

    @admin.display(description=_("history"))
    def history_table(self, work: DeferredWork) -> SafeString:
        return render_to_string(
            "admin/nexus_workflows/deferredwork/history.html", {"rows": display.history_rows(work)}
        )

    @admin.display(description=_("first started"))
    def started_column(self, work: DeferredWork) -> SafeString:
        return display.when(work.first_started_at, now=display.now_of(work))

    @admin.display(description=_("finished"))
    def finished_column(self, work: DeferredWork) -> SafeString:
        return display.when(work.finished_at, now=display.now_of(work))

    @admin.display(description=_("runners (one per attempt)"))
    def worker_ids_list(self, work: DeferredWork) -> str:
        return ", ".join(map(str, work.worker_ids or [])) or "—"

    @admin.display(description=_("errors (oldest first; exception types)"))
    def error_types_list(self, work: DeferredWork) -> str:
        # The types only: a traceback may quote patient data (revealed on request).
        types = [str(e.get("exception_class_path", "?")) for e in work.errors or [] if isinstance(e, dict)]
        return ", ".join(types) or "—"

    # --- actions ------------------------------------------------------------------------

    @admin.action(description=_("Revive selected abandoned work"), permissions=["revive"])
    def revive_selected(self, request: HttpRequest, queryset: QuerySet[DeferredWork]) -> None:
        self._revive(request, queryset, selected=True)

    @admin.action(description=_("Run selected pending work now"), permissions=["revive"])
    def run_selected_now(self, request: HttpRequest, queryset: QuerySet[DeferredWork]) -> None:
        self._run_now(request, queryset, selected=True)

    def render_delete_form(self, request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
        # One item's delete page says what is lost too, like the bulk action's.
        work = context.get("object")
        if isinstance(work, DeferredWork):
            context["losses"] = describe_losses({work.status: 1})
        return super().render_delete_form(request, context)

    @admin.action(description=_("Delete selected deferred work"), permissions=["delete"])
    def delete_selected(self, request: HttpRequest, queryset: QuerySet[DeferredWork]) -> HttpResponse | None:
        """Django's bulk delete, but only after a confirmation page that says what will be
        lost, confirmed for exactly the selection and counts it showed (a bare
        ``post=yes`` is not enough)."""
        summary = delete_summary(queryset)
        token = request.POST.get("confirm", "")
        if token and is_confirmed(token, request, summary):
            return django_delete_selected(self, request, queryset)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Delete selected deferred work?"),
            "opts": self.opts,
            "summary": summary,
            "losses": describe_losses(summary["counts"]),
            "total": len(summary["pks"]),
            "active": sum(summary["counts"].get(status, 0) for status in (Status.PENDING, Status.PROCESSING)),
            "confirm": sign_confirmation(request, summary),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        return TemplateResponse(
            request, "admin/nexus_workflows/deferredwork/delete_selected_confirmation.html", context
        )

    def _revive(
        self, request: HttpRequest, queryset: QuerySet[DeferredWork], *, selected: bool = False
    ) -> None:
        result = triage.revive(queryset, by="admin", user=request.user.get_username())
        message = gettext("Revived: abandoned → pending, attempt 0, due now, checkpoints kept.")
        self._log(request, result, message)
        self._report(request, result, REVIVED, selected=selected)

    def _run_now(
        self, request: HttpRequest, queryset: QuerySet[DeferredWork], *, selected: bool = False
    ) -> None:
        result = triage.run_now(queryset, by="admin", user=request.user.get_username())
        self._log(request, result, gettext("Run now: pending work made due now."))
        self._report(request, result, MADE_DUE, selected=selected)

    def _log(self, request: HttpRequest, result: triage.TriageResult, message: str) -> None:
        if not result.changed:
            return
        # Read back where they were changed: a lagging replica would still show the old status.
        changed = (
            DeferredWork.objects.using(result.using)
            .filter(pk__in=[ref.pk for ref in result.changed])
            .only("pk", "kind", "status")
        )
        LogEntry.objects.log_actions(staff_user_pk(request), changed, CHANGE, change_message=message)

    def _report(
        self, request: HttpRequest, result: triage.TriageResult, wording: ResultWording, *, selected: bool
    ) -> None:
        if selected:  # rows ticked on the list page and deleted since are counted too
            count_gone(request, result)
        self.message_user(
            request,
            describe_result(result, wording),
            messages.SUCCESS if result.changed and not result.skipped else messages.WARNING,
        )
        for kind in result.unregistered_kinds:
            self.message_user(
                request,
                gettext(
                    "No workflow is registered for kind %(kind)s in this project, so no runner "
                    "here will pick that work up until one that knows the kind starts."
                )
                % {"kind": repr(kind)},
                messages.WARNING,
            )

    # --- detail page buttons ------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        return [  # the mixin's reveal URL comes with super().get_urls()
            path(  # before "<path:object_id>/reveal/", which would take it for an id
                "jobs/<str:queue_name>/<str:job_id>/reveal/",
                self.admin_site.admin_view(hides_patient_data(self.job_reveal_view)),
                name=REVEAL_URL_NAME,
            ),
            path(
                "dashboard/",
                self.admin_site.admin_view(self.dashboard_view),
                name="{}_{}_dashboard".format(*info),
            ),
            path(
                "<path:object_id>/revive/",
                self.admin_site.admin_view(hides_patient_data(self.revive_view)),
                name="{}_{}_revive".format(*info),
            ),
            path(
                "<path:object_id>/run-now/",
                self.admin_site.admin_view(hides_patient_data(self.run_now_view)),
                name="{}_{}_run_now".format(*info),
            ),
            *super().get_urls(),
        ]

    # The search box (FindByPostMixin): keys may be patient data.
    find_field = "key"
    find_not_found = _("No deferred work has that dedupe key.")
    find_logged = _("Found by its dedupe key (nothing was changed).")
    find_nothing_logged = _("Looked for by a dedupe key that no work has (nothing was changed).")

    def find_objects(self, typed: str, listed: QuerySet[Any]) -> list[Any]:
        if json_values.text_problem(typed):  # enqueue stores no such key; PostgreSQL would fail
            return []
        with sql.for_connection(listed.db).values_sent_apart(listed.db):  # a cancel is logged without it
            return list(listed.filter(dedupe_key=typed).only("pk", "kind", "status")[:100])

    def find_many_message(self, found: list[Any]) -> str:  # one per kind at most
        return gettext("%(count)d items have that dedupe key: %(items)s. This is the first.") % {
            "count": len(found),
            "items": ", ".join(f"{work.kind} #{work.pk}" for work in found),
        }

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        return observability_admin.dashboard_view(self, request)

    def job_reveal_view(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        return jobs.reveal_job_view(request, queue_name, job_id, model_admin=self)

    def revive_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._button(request, object_id, self._revive)

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._button(request, object_id, self._run_now)

    def _button(self, request: HttpRequest, object_id: str, act: Any) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        # Both: acting on a row one may not see is acting blind.
        if not self.has_revive_permission(request) or not self.has_view_permission(request):
            raise PermissionDenied
        work = self.get_object(request, unquote(object_id))
        if work is None:
            return missing_object_redirect(self, request, object_id)
        act(request, self.get_queryset(request).filter(pk=work.pk))
        return HttpResponseRedirect(self._change_url(work.pk))

    def _change_url(self, pk: int) -> str:
        return reverse(
            f"admin:{self.opts.app_label}_{self.opts.model_name}_change",
            args=[pk],
            current_app=self.admin_site.name,
        )

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        work = super().get_object(request, object_id, from_field)
        if work is not None:  # the page's times are judged by the database's clock
            display.read_now(request, [work], work._state.db or "default")
        return work

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        work = self.get_object(request, unquote(object_id))
        context = dict(extra_context or {})
        if work is not None:
            context["title"] = f"{work.kind} #{work.pk}"
            context["subtitle"] = None
            context["triage"] = self._triage_context(request, work)
        return super().change_view(request, object_id, form_url, context)

    def _triage_context(self, request: HttpRequest, work: DeferredWork) -> dict[str, Any]:
        info = self.opts.app_label, self.opts.model_name
        now = display.now_of(work)
        due = work.status == Status.PENDING and work.next_attempt_at <= now
        may_revive = self.has_revive_permission(request)
        actionable = work.status == Status.ABANDONED or (work.status == Status.PENDING and not due)
        return {
            "work": work,
            "stale": triage.is_stale(work, now),
            "attempt_number": display.attempt_number(work),
            "max_attempts": display.allowed_attempts(work),
            "may_revive": may_revive,
            "permission_hint": actionable and not may_revive,
            "revive_url": reverse(f"admin:{info[0]}_{info[1]}_revive", args=[work.pk]),
            "run_now_url": reverse(f"admin:{info[0]}_{info[1]}_run_now", args=[work.pk]),
            "due": due,
            "may_reveal": self.has_reveal_permission(request, work),
            "reveal_url": self.reveal_url(work),
            "held_by": waiting_reason(work) if due else None,
        }

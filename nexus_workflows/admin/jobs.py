"""The one page where a person sees a fire-and-forget job's trigger and error message.

django-rq's job pages show a job's arguments and meta to any staff user; for our jobs they
hold only ciphertext (:mod:`nexus_workflows.fire_and_forget.sealing`). This page opens them
as the deferred work's reveal page does (:mod:`nexus_workflows.admin.reveal`), for a user
with the same two permissions, the ones for workflow data, deferred or fire-and-forget:
``nexus_workflows.reveal_deferredwork`` and the view (or change) permission on deferred
work. ``GET`` asks for confirmation and shows nothing, not even whether the job exists;
``POST`` shows the data, writes one admin log entry (who, when, which job; never the
data; a job that is not there is logged too) and is sent with ``Cache-Control: no-store``.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotFound
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext, gettext_noop

from nexus_workflows.admin import display
from nexus_workflows.admin.reveal import private, staff_user_pk
from nexus_workflows.exceptions import SealedDataUnreadable
from nexus_workflows.fire_and_forget.job import error_of, is_workflow_job, trigger_of
from nexus_workflows.fire_and_forget.job_ids import split_job_id
from nexus_workflows.fire_and_forget.sending import configured_queues, get_queue
from nexus_workflows.phi.keys import keyring

TEMPLATE = "admin/nexus_workflows/job_reveal.html"
NOT_FOUND = gettext_noop("No fire-and-forget workflow job with that id is in this queue.")
REVEALED_LOGGED = gettext_noop(
    "Revealed the trigger and error message of a %(kind)s job (nothing was changed)."
)
NOT_FOUND_LOGGED = gettext_noop("Looked for a %(kind)s job to reveal; none with that id was in its queue.")


def reveal_job_view(request: HttpRequest, queue_name: str, job_id: str, *, model_admin: Any) -> HttpResponse:
    """``model_admin``: deferred work's, whose reveal permission (reveal and view, as for a
    work item: django-rq's own job pages ask only for staff) this page asks for."""
    if not model_admin.has_reveal_permission(request):
        raise PermissionDenied
    admin_site = model_admin.admin_site
    if queue_name not in configured_queues():
        raise Http404(gettext("No RQ queue of that name is configured."))
    try:
        kind, _ = split_job_id(job_id)
    except ValueError:
        raise Http404(gettext(NOT_FOUND)) from None
    revealed: dict[str, Any] | None = None
    if request.method == "POST":
        # Only here is Redis asked: whether a job exists for a key (a patient) is patient
        # data, so a GET, which audits nothing, answers the same either way, and a miss is
        # audited as a reveal is (misses are what probing looks like).
        job = get_queue(queue_name).fetch_job(job_id)
        if job is None or not is_workflow_job(job):
            _log(request, job_id, kind, NOT_FOUND_LOGGED)
            return HttpResponseNotFound(gettext(NOT_FOUND))
        revealed = _open(job)
        _log(request, job_id, kind, REVEALED_LOGGED)
    context = {
        **admin_site.each_context(request),
        "title": gettext("Reveal the trigger and error message of a %(kind)s job") % {"kind": kind},
        "kind": kind,
        "job_id": job_id,
        "job_url": _django_rq_job_url(queue_name, job_id),
        "revealed": revealed is not None,
        **(revealed or {}),
    }
    return private(TemplateResponse(request, TEMPLATE, context))


def _open(job: Any) -> dict[str, Any]:
    """What the page shows; a value no key opens is said so, never shown as ciphertext."""
    shown: dict[str, Any] = {}
    try:
        shown["trigger"] = display.json_block(trigger_of(job), empty="No trigger.")
    except SealedDataUnreadable as error:
        shown["trigger_problem"] = str(error)
    try:
        message = error_of(job)
    except SealedDataUnreadable as error:
        shown["error_problem"] = str(error)
    else:
        if message is not None:
            shown["error"] = display.error_block(message)
    return shown


def _log(request: HttpRequest, job_id: str, kind: str, message: str) -> None:
    # No content type: a job is not a model instance. The job id carries the dedupe key
    # and log entries are never purged, so object_id keeps its keyed hash (an auditor
    # with a job id finds its reveals: audit_id); the repr, shown in every staff user's
    # "recent actions", names the kind, as deferred work's does.
    LogEntry.objects.create(
        user_id=staff_user_pk(request),
        content_type=None,
        object_id=audit_id(kind, job_id),
        object_repr=gettext("fire-and-forget %(kind)s job") % {"kind": kind},
        action_flag=CHANGE,
        change_message=gettext(message) % {"kind": kind},
    )


def _django_rq_job_url(queue_name: str, job_id: str) -> str | None:
    try:
        return reverse("admin:django_rq_job_detail", args=[configured_queues().index(queue_name), job_id])
    except NoReverseMatch:
        return None


def audit_id(kind: str, job_id: str) -> str:
    """The ``object_id`` of a job's reveals in the admin log: a keyed hash of its id."""
    return keyring().flow_key_hash(kind, "audit", job_id)

"""The triage desk's actions, apart from the page: what deleting loses, the signed
confirmation of a bulk delete, and the messages of revive and run now (with plurals)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib.admin import helpers
from django.core import signing
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.functional import Promise
from django.utils.translation import gettext, gettext_noop, ngettext
from django.utils.translation import gettext_lazy as _

from nexus_workflows.deferred import triage
from nexus_workflows.models import DeferredWork, Status

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

# A delete confirmation is good for this long, for the selection and counts it showed.
DELETE_CONFIRMATION_MAX_AGE = 600
_DELETE_SALT = "nexus_workflows.admin.delete_selected"


_LOSSES = {
    Status.PENDING: _(
        "will never run; triggers and checkpoints are deleted, and the dedupe keys are free "
        "again (the next enqueue of one creates new work)"
    ),
    Status.PROCESSING: _(
        "may be running right now; the runner's result is discarded when it finishes, and it is never "
        "retried; its kind's concurrency slot and its serial key are free at once, so another item of "
        "them may start while it still runs"
    ),
    Status.ABANDONED: _("can no longer be revived; errors and history are gone"),
    Status.DONE: _(
        "records and history are gone, and the dedupe keys are free again (they would be purged "
        "after the retention period anyway)"
    ),
}


def delete_summary(queryset: QuerySet[DeferredWork]) -> dict[str, Any]:
    rows = list(queryset.order_by("pk").values_list("pk", "status"))
    counts: dict[str, int] = {}
    for _pk, status in rows:
        counts[status] = counts.get(status, 0) + 1
    return {"pks": [pk for pk, _status in rows], "counts": counts}


def describe_losses(counts: dict[str, int]) -> list[tuple[str, int, StrOrPromise]]:
    order = (Status.PENDING, Status.PROCESSING, Status.ABANDONED, Status.DONE)
    return [
        (str(status.label).lower(), counts[status], _LOSSES[status]) for status in order if counts.get(status)
    ]


def sign_confirmation(request: HttpRequest, summary: dict[str, Any]) -> str:
    """The confirmation page's token: this user's, for exactly this selection and counts."""
    return signing.dumps({**summary, "user": request.user.pk}, salt=_DELETE_SALT, compress=True)


def is_confirmed(token: str, request: HttpRequest, summary: dict[str, Any]) -> bool:
    """Whether ``token`` is this user's confirmation of exactly this selection and counts."""
    try:
        confirmed = signing.loads(token, salt=_DELETE_SALT, max_age=DELETE_CONFIRMATION_MAX_AGE)
    except signing.BadSignature:
        return False
    return confirmed == {**summary, "user": request.user.pk}


@dataclass(frozen=True)
class ResultWording:
    """What a triage action's message says: translatable, with plurals (``ngettext``)."""

    changed: tuple[str, str]  # "Revived %(count)d item", and its plural
    wanted: Promise  # the status the action takes, as skipped rows were not


REVIVED = ResultWording(
    (gettext_noop("Revived %(count)d item"), gettext_noop("Revived %(count)d items")), _("abandoned")
)
MADE_DUE = ResultWording(
    (gettext_noop("Made due now %(count)d item"), gettext_noop("Made due now %(count)d items")), _("pending")
)


def count_gone(request: HttpRequest, result: triage.TriageResult) -> None:
    """Add the rows the action's POST selected but did not get to ``result``'s skipped:
    "gone" when deleted or purged since the list page, "changed" when still there but out
    of the list's filter since (Django's action only gets the rows the filter still shows,
    and the message would count the others nowhere). Not for "select all" (that selection
    is a filter, not rows) nor a detail page's button."""
    if request.POST.get("select_across") == "1":
        return
    triage.account_for_selected(result, request.POST.getlist(helpers.ACTION_CHECKBOX_NAME))


def describe_result(result: triage.TriageResult, wording: ResultWording) -> str:
    """``Revived 2 items; skipped 1 that was not abandoned (1 pending).``"""
    changed = len(result.changed)
    text = ngettext(*wording.changed, changed) % {"count": changed}
    skipped = len(result.skipped)
    if not skipped:
        return gettext("%(changed)s; skipped none.") % {"changed": text}
    by_status: dict[str, int] = {}
    for ref in result.skipped:
        by_status[ref.status] = by_status.get(ref.status, 0) + 1
    breakdown = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))
    skipped_text = ngettext(
        "skipped %(count)d that was not %(wanted)s (%(breakdown)s)",
        "skipped %(count)d that were not %(wanted)s (%(breakdown)s)",
        skipped,
    ) % {"count": skipped, "wanted": wording.wanted, "breakdown": breakdown}
    return gettext("%(changed)s; %(skipped)s.") % {"changed": text, "skipped": skipped_text}

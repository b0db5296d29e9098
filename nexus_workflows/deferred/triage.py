"""What an operator does to deferred work: revive what was abandoned, run what waits now.

The admin triage desk and ``manage.py workflows revive`` both call these functions. Every
write is a compare-and-set on the row's status (and, for revive, on its ``updated_at``),
so a row a runner is working on is never touched and a row that changed since it was
read is read again instead of being overwritten.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import router
from django.db.models import Q, QuerySet
from django.views.decorators.debug import sensitive_variables

from nexus_workflows import signals
from nexus_workflows.clock import database_now, now_plus
from nexus_workflows.conf import app_settings
from nexus_workflows.deferred.history import append_entry
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.transitions import revive as revive_rows
from nexus_workflows.deferred.transitions import run_now as make_due_now
from nexus_workflows.deferred.wakeup import notify
from nexus_workflows.models import DeferredWork, Status

logger = logging.getLogger("nexus_workflows.triage")  # the name it has always logged under

# Reads and compare-and-set attempts per row before giving up on a row that keeps
# changing under us (only concurrent writers can make it change).
_ROUNDS = 3

_CHUNK = 500
_FIELDS = ("pk", "kind", "dedupe_key", "status", "history", "updated_at")


#: What a skipped row's status says when it was deleted or purged before the action.
GONE = "gone"
#: ... when it is still there but no longer matched the action's selection (a list filtered
#: by status, say, after a runner or a colleague changed the row).
CHANGED = "changed"


@dataclass(frozen=True)
class WorkRef:
    """One row as the operator sees it in a result: never its trigger or checkpoints."""

    pk: int
    kind: str
    # Patient data, often: out of the repr (and a result's), which tracebacks, debuggers
    # and a caller's log lines show. None when it was never read: the row was gone before
    # it was read whole (GONE), or it was only counted (account_for_selected).
    dedupe_key: str | None = field(repr=False)
    # The status the row had when it was changed or skipped: GONE when it vanished, CHANGED
    # when it left the action's filter since the page listed it.
    status: str

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk}"


@dataclass
class TriageResult:
    changed: list[WorkRef] = field(default_factory=list)
    skipped: list[WorkRef] = field(default_factory=list)
    #: The database the rows were changed on (the router's for writes; see ``_database``).
    using: str = "default"

    @property
    def unregistered_kinds(self) -> list[str]:
        """Kinds of changed rows that no runner of this project will pick up."""
        # A Django task's kind is its import path, which any runner imports when it runs it.
        return sorted({ref.kind for ref in self.changed if ref.kind not in registry and "." not in ref.kind})


# --- what needs attention --------------------------------------------------------------


def stale_cutoff(now: datetime | None = None, *, using: str | None = None) -> datetime:
    """Processing work whose last heartbeat is older than this belongs to a dead runner.

    ``now`` defaults to the database's clock (``using``, else where deferred work is
    read), never this host's: heartbeats are the database's time (README "One clock")."""
    if now is None:
        now = database_now(using or router.db_for_read(DeferredWork))
    return now - timedelta(seconds=app_settings.STALE_AFTER)


def stale_q(now: datetime | None = None) -> Q:
    """Processing rows with a stale heartbeat, or with none at all (no runner would
    ever reclaim those on its own). Without ``now`` the statement compares with the
    database's own clock."""
    stale_after = timedelta(seconds=app_settings.STALE_AFTER)
    cutoff: Any = now_plus(-stale_after) if now is None else stale_cutoff(now)
    return Q(status=Status.PROCESSING) & (Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True))


def needs_attention_q(now: datetime | None = None) -> Q:
    """Abandoned work plus processing work whose runner seems to be gone."""
    return Q(status=Status.ABANDONED) | stale_q(now)


def is_stale(work: DeferredWork, now: datetime | None = None) -> bool:
    """Whether ``work`` is processing with a stale heartbeat; ``now`` defaults to the
    clock of the database the row was read from (one query: pass it for many rows)."""
    if work.status != Status.PROCESSING:
        return False
    return work.heartbeat_at is None or work.heartbeat_at < stale_cutoff(now, using=work._state.db)


# --- actions ---------------------------------------------------------------------------


def _rows(queryset: QuerySet[DeferredWork]) -> Iterator[dict]:
    """The rows of ``queryset`` in id order, ids and rows read from where they are changed.

    The ids are collected first, so that the updates made while walking them cannot move
    rows in or out of an open cursor (SQLite gives no isolation within a connection).
    Only what the compare-and-set needs is read: the trigger and checkpoints stay put. A
    row deleted or purged between the two reads comes as :data:`GONE` (its id and kind),
    so that the result counts it, as the admin counted it selected.
    """
    using = _database(queryset)
    # The ids too: a replica that lags would leave out rows abandoned since it last caught
    # up, and "revive every abandoned" would quietly revive fewer.
    kinds = dict(queryset.using(using).order_by().values_list("pk", "kind"))
    pks = sorted(kinds)
    for start in range(0, len(pks), _CHUNK):
        chunk = pks[start : start + _CHUNK]
        found = {
            row["pk"]: row for row in DeferredWork.objects.using(using).filter(pk__in=chunk).values(*_FIELDS)
        }
        for pk in chunk:
            yield found.get(pk) or _gone(pk, kinds[pk])


def _gone(pk: int, kind: str) -> dict:
    """A row read by id, then deleted before it was read whole: what its skip says."""
    return {"pk": pk, "kind": kind, "dedupe_key": None, "status": GONE, "history": [], "updated_at": None}


def _database(queryset: QuerySet[DeferredWork]) -> str:
    """Where the rows of ``queryset`` are read for the compare-and-set and changed: the
    database it was given (``using()``), else the router's choice for writes, as Django's
    own ``update()`` picks. ``queryset.db`` alone is the router's choice for reads (a read
    replica, say: the admin's querysets are), where the writes would fail."""
    return queryset.select_for_update().db  # a QuerySet for writing; nothing runs here


def _reread(using: str, pk: int) -> dict | None:
    return DeferredWork.objects.using(using).filter(pk=pk).values(*_FIELDS).first()


def _ref(row: dict, status: str | None = None) -> WorkRef:
    return WorkRef(row["pk"], row["kind"], row["dedupe_key"], status or row["status"])


# sensitive_variables: an error report (Django's, DEBUG off) of a write that fails in here
# (a lock wait cut short, a failover) shows no frame's variables: the rows read hold dedupe
# keys and, in their history, error messages, which are patient data (revealed on request).
@sensitive_variables()
def revive(queryset: QuerySet[DeferredWork], *, by: str, user: str = "") -> TriageResult:
    """Revive the abandoned rows of ``queryset``: pending, attempt 0, due now, error and
    claim cleared, checkpoints kept, and a ``revived`` entry in their history.

    Rows in any other status are skipped. ``by`` says where the revive came from
    ("admin", "command line") and ``user`` who did it; both go into the history entry.
    """
    using = _database(queryset)
    result = TriageResult(using=using)
    who = {"by": by, **({"user": user} if user else {})}
    for row in _rows(queryset):
        for _ in range(_ROUNDS):
            if row["status"] != Status.ABANDONED:
                result.skipped.append(_ref(row))
                break
            # The updated_at match makes this a compare-and-set on the whole row: the
            # history written below was computed from exactly the row we read.
            matched = revive_rows(
                DeferredWork.objects.using(using).filter(pk=row["pk"], updated_at=row["updated_at"]),
                history=append_entry(row["history"], event="revived", **who),
            )
            if matched:
                result.changed.append(_ref(row))
                break
            fresh = _reread(using, row["pk"])
            if fresh is None:
                result.skipped.append(_ref(row, GONE))
                break
            row = fresh
        else:
            result.skipped.append(_ref(row))
    _after(result, using, "revived", who)
    for ref in result.changed:
        signals.send(signals.work_revived, kind=ref.kind, id=ref.pk, attempt=1)
    return result


@sensitive_variables()  # as revive's
def run_now(queryset: QuerySet[DeferredWork], *, by: str, user: str = "") -> TriageResult:
    """Make the pending rows of ``queryset`` due now; other rows are skipped.

    The attempt count and the history are left as they are: this only moves the wait.
    """
    using = _database(queryset)
    result = TriageResult(using=using)
    for row in _rows(queryset):
        if row["status"] != Status.PENDING:
            result.skipped.append(_ref(row))
            continue
        matched = make_due_now(DeferredWork.objects.using(using).filter(pk=row["pk"]))
        if matched:
            result.changed.append(_ref(row))
        else:
            fresh = _reread(using, row["pk"])
            result.skipped.append(_ref(row, fresh["status"] if fresh else GONE))
    _after(result, using, "made due now", {"by": by, **({"user": user} if user else {})})
    return result


def account_for_selected(result: TriageResult, selected: Iterable[str]) -> None:
    """Add the ``selected`` ids (as posted) that the action's queryset did not hold to
    ``result``'s skipped: GONE where no row has the id any more, CHANGED where the row is
    there but left the selection's filter since it was listed. Read where the action wrote."""
    seen = {ref.pk for ref in (*result.changed, *result.skipped)}
    missing = {int(pk) for pk in map(str, selected) if pk.isascii() and pk.isdigit()} - seen
    if not missing:
        return
    # Kind and id only, as for every other ref: the dedupe key is not needed to count it.
    present = dict(DeferredWork.objects.using(result.using).filter(pk__in=missing).values_list("pk", "kind"))
    for pk in sorted(missing):
        if pk in present:
            result.skipped.append(WorkRef(pk, present[pk], None, CHANGED))
        else:  # nothing is known of it but the posted id, which no message shows
            result.skipped.append(WorkRef(0, "", None, GONE))


def _after(result: TriageResult, using: str, what: str, who: dict[str, str]) -> None:
    if result.changed:
        notify(using)  # wake idle runners instead of waiting for their next poll
    actor = describe_actor(**who)
    for ref in result.changed:
        # Kind and id only: the dedupe key may be derived from patient data.
        logger.info("%s #%s %s %s", ref.kind, ref.pk, what, actor)


#: How each source of a triage action reads in a sentence ("revived in the admin by alice").
_SOURCES = {"admin": "in the admin", "command line": "from the command line"}


def describe_actor(by: str, user: str = "") -> str:
    """Where a triage action came from and who did it, as words that follow the verb."""
    source = _SOURCES.get(by, f"by {by}")
    return f"{source} by {user}" if user else source

"""Claiming deferred work and every fenced write that follows a claim.

A claim is a compare-and-set ``UPDATE`` that moves due (or stale) rows to ``processing``
and stamps them with a fresh claim token. Every later write of that attempt filters on
``id`` *and* the token and is judged by the rows it matched: a write that matches
nothing means the claim was lost (another runner reclaimed the work, or an operator
changed it), and nothing was written.

Every time written here comes from the database (``DatabaseNow()``), never from the runner's host:
runners on hosts whose clocks disagree still agree on what is due and what is stale.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import (
    Case,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    JSONField,
    Q,
    Value,
    When,
)
from django.db.models.functions import Coalesce
from django.db.models.sql import UpdateQuery

from . import json_values
from .clock import DatabaseNow, database_now
from .exceptions import ClaimLost, InvalidCheckpoint, WorkerLost
from .expressions import JSONAppend, JSONDropLast
from .flow.claiming import FlowClaimer
from .history import append_entry
from .models import DeferredWork, Status

_CLAIM_FIELDS = (
    "pk",
    "kind",
    "dedupe_key",
    "trigger",
    "checkpoints",
    "attempt",
    "history",
    "lost_unstarted",
)
# Read at claim time too, for Django tasks (their TaskResult and TaskContext); kept in
# ClaimedWork.columns.
_TASK_FIELDS = (
    "priority",
    "queue_name",
    "backend_name",
    "worker_ids",
    "created_at",
    "first_started_at",
    "last_attempted_at",
)


def now_plus(delta: timedelta) -> Any:
    """The database's current time plus ``delta``, as an expression."""
    later = DatabaseNow() + Value(delta, output_field=DurationField())
    return ExpressionWrapper(later, output_field=DateTimeField())


_ONE_VARIANT: tuple[tuple[Q | None, dict[str, Any]], ...] = ((None, {}),)

#: A reclaim counts the lost attempt only if its prepare had started (``started_at`` set);
#: otherwise it counts a claim lost before starting (bounded by the crash-loop guard).
STALE_VARIANTS: tuple[tuple[Q | None, dict[str, Any]], ...] = (
    (Q(started_at__isnull=False), {"attempt": F("attempt") + 1}),
    (Q(started_at__isnull=True), {"lost_unstarted": F("lost_unstarted") + 1}),
)

# When a claim loses rows to another runner, the next claims pick at random among this
# many times more candidates, so that runners sharing a table stop colliding.
_CONTENTION_SPREAD = 4


@dataclass
class ClaimedWork:
    """A row this runner holds, as it was read at claim time."""

    id: int
    kind: str
    dedupe_key: str
    trigger: Any
    checkpoints: dict[str, Any]
    attempt: int
    history: list[Any]
    claim_token: str
    reclaimed: bool = False
    # Reclaimed only: whether the lost attempt's prepare had started (then it counted).
    lost_started: bool = False
    # Claims of this row lost before their prepare started (bounded by the guard).
    lost_unstarted: int = 0
    # Which of the claim's variants took the row (see ``Claimer.claim_rows``).
    claim_variant: int = 0
    # Set when ``history`` gained entries that only an individual write can persist.
    history_changed: bool = False
    using: str = "default"
    # The _TASK_FIELDS columns as the claim left them.
    columns: dict[str, Any] = field(default_factory=dict)
    # Set by an attempt of a Django task (nexus_workflows.tasks) for the outcome write:
    # what it returned, how it failed ({"exception_class_path", "traceback"}), and the
    # TaskResult its signals carry.
    return_value: Any = None
    error_record: dict[str, str] | None = None
    task_result: Any = None

    @property
    def is_task(self) -> bool:
        """A Django task's row: its kind is an import path (workflow kinds have no dot)."""
        return "." in self.kind

    def fenced(self) -> Any:
        """The queryset matching this row only while our claim holds."""
        return DeferredWork.objects.using(self.using).held(self.claim_token).filter(pk=self.id)

    @property
    def key(self) -> tuple[str, int]:
        """This attempt, as opposed to this row: a row may be claimed again."""
        return (self.claim_token, self.id)


class Claimer:
    """Claims batches of due and stale work for one runner."""

    def __init__(
        self,
        *,
        kinds: Sequence[str],
        using: str,
        queues: Sequence[str] | None = (),
        worker_id: str = "",
    ) -> None:
        self.kinds = list(kinds)
        # Django task queues to take: a list, or None for every queue. Tasks have no flow
        # limits: they always take the plain claim.
        self.queues = None if queues is None else list(queues)
        self.using = using
        self.worker_id = worker_id or uuid.uuid4().hex
        self.contended = False
        # Kinds with flow limits are claimed by the flow claimer, only as far as their
        # limits let them start; every other kind keeps the plain claim below.
        self.flow = FlowClaimer.for_kinds(self.kinds, using)
        self.plain_kinds = [k for k in self.kinds if not self.flow or k not in self.flow.kinds]

    def _selection(self) -> Q:
        """What the plain claim takes: the kinds without flow limits and the task queues."""
        selection = Q(kind__in=self.plain_kinds)
        if self.queues is None:
            return selection | ~Q(queue_name="")
        if self.queues:
            return selection | Q(queue_name__in=self.queues)
        return selection

    def _idle(self) -> bool:
        return not self.kinds and self.queues == []

    def _has_plain(self) -> bool:
        return bool(self.plain_kinds) or self.queues != []

    def _claim(
        self,
        candidates: Any,
        limit: int,
        order_by: Sequence[str],
        *,
        reclaimed: bool,
        variants: Sequence[tuple[Q | None, dict[str, Any]]] = _ONE_VARIANT,
        **changes: Any,
    ) -> list[ClaimedWork]:
        """Compare-and-set up to ``limit`` rows of ``candidates`` (of the kinds without flow
        limits) to a new claim token and return them as claimed.

        The ids are read first and the ``UPDATE`` names them as literals and re-checks the
        candidate conditions, so its plan is a primary-key lookup whatever the table's
        statistics say (a one-statement ``UPDATE … IN (SELECT … LIMIT)`` can get a
        nested-loop plan on a freshly filled table and take hundreds of milliseconds).
        """
        candidates = candidates.filter(self._selection())
        spread = _CONTENTION_SPREAD if self.contended else 1
        ids = list(candidates.order_by(*order_by).values_list("pk", flat=True)[: limit * spread])
        if spread > 1 and len(ids) > limit:
            chosen = set(random.sample(ids, limit))
            ids = [pk for pk in ids if pk in chosen]  # still in priority order
        if not ids:
            return []
        return self.claim_rows(candidates, ids, reclaimed=reclaimed, variants=variants, **changes)

    def claim_rows(
        self,
        candidates: Any,
        ids: list[int],
        *,
        reclaimed: bool,
        variants: Sequence[tuple[Q | None, dict[str, Any]]] = _ONE_VARIANT,
        **changes: Any,
    ) -> list[ClaimedWork]:
        """Compare-and-set the rows ``ids`` of ``candidates`` (the conditions are checked
        again by the ``UPDATE``) to a new claim token; returns those it got.

        Where the database can, the ``UPDATE`` returns the rows it claimed
        (``RETURNING``); elsewhere they are read back by their token. ``variants`` split
        the ``UPDATE`` by a condition re-checked in it, each with changes of its own; each
        claimed row says which one claimed it (``claim_variant``).
        """
        token = uuid.uuid4().hex
        changes.update(
            claim_token=token,
            claimed_at=DatabaseNow(),
            heartbeat_at=DatabaseNow(),
            updated_at=DatabaseNow(),
            # This attempt's prepare has not started yet (the marker is written once it has).
            started_at=None,
            # Django tasks' TaskResult: the first and the latest attempt, and every runner
            # that claimed the work (its attempts; a claim given back drops its entry).
            first_started_at=Coalesce(F("first_started_at"), DatabaseNow()),
            last_attempted_at=DatabaseNow(),
            worker_ids=JSONAppend("worker_ids", self.worker_id),
        )
        claimed = candidates.filter(pk__in=ids)
        found: list[tuple[dict[str, Any], int]] = []
        for index, (condition, extra) in enumerate(variants):
            subset = claimed.filter(condition) if condition is not None else claimed
            if _can_return_from_update(self.using):
                rows = _update_returning(subset, {**changes, **extra}, self.using)
            else:
                before = {row["pk"] for row, _ in found}
                matched = subset.update(**{**changes, **extra})
                rows = [row for row in self._load(ids, token) if row["pk"] not in before] if matched else []
            found.extend((row, index) for row in rows)
        self.contended = len(found) < len(ids)
        # Hand them out in the claim's order (priority first): RETURNING keeps no order.
        position = {pk: index for index, pk in enumerate(ids)}
        found.sort(key=lambda item: position.get(item[0]["pk"], len(ids)))
        return [
            ClaimedWork(
                id=row["pk"],
                kind=row["kind"],
                dedupe_key=row["dedupe_key"],
                trigger=row["trigger"],
                checkpoints=dict(row["checkpoints"] or {}),
                attempt=row["attempt"],
                history=list(row["history"] or []),
                claim_token=token,
                reclaimed=reclaimed,
                lost_unstarted=row["lost_unstarted"],
                claim_variant=index,
                using=self.using,
                columns={name: row[name] for name in _TASK_FIELDS},
            )
            for row, index in found
        ]

    def _load(self, ids: list[int], token: str) -> list[dict[str, Any]]:
        rows = DeferredWork.objects.using(self.using).held(token).filter(pk__in=ids)
        return list(rows.values(*_CLAIM_FIELDS, *_TASK_FIELDS))

    def claim_due(
        self, limit: int, *, now: datetime | None = None, startable: int | None = None
    ) -> list[ClaimedWork]:
        """Claim up to ``limit`` pending rows whose time has come (by the database's clock,
        or ``now``): highest priority first (Django tasks; workflows are all 0), then the
        longest due (the order of ``nw_due_idx``); of kinds with flow limits, at most
        ``startable`` (the runner's free threads)."""
        if limit <= 0 or self._idle():
            return []
        works: list[ClaimedWork] = []
        if self.flow is not None:
            # Limited kinds: only what their limits let start now.
            startable = limit if startable is None else min(limit, startable)
            works = self.flow.claim_due(self, limit, now, startable)
            limit -= len(works)
        if limit > 0 and self._has_plain():
            due = DeferredWork.objects.using(self.using).due(now or DatabaseNow())
            works += self._claim(
                due, limit, ("-priority", "next_attempt_at"), reclaimed=False, status=Status.PROCESSING
            )
        return works

    def takes_by_id(self, kind: str) -> bool:
        """Whether a row of ``kind`` may be claimed by id (:meth:`claim_due_ids`): a kind
        of this claimer without flow limits, or a Django task when it takes task queues
        (the claim re-checks the row's queue)."""
        if "." in kind:
            return self.queues != []
        return kind in self.plain_kinds

    def claim_due_ids(self, ids: list[int], *, now: datetime | None = None) -> list[ClaimedWork]:
        """Claim the rows ``ids`` if they are still pending, due and of this claimer's
        selection (of kinds without flow limits): one ``UPDATE … RETURNING``, no ``SELECT``
        first; the wake-up path for a row whose NOTIFY named it."""
        if not ids or not self._has_plain():
            return []
        due = DeferredWork.objects.using(self.using).due(now or DatabaseNow()).filter(self._selection())
        return self.claim_rows(due, ids, reclaimed=False, status=Status.PROCESSING)

    def retry_in(self) -> float | None:
        """Seconds until a rate window the last claim found full has a start again."""
        return self.flow.retry_in if self.flow is not None else None

    def claim_stale(
        self, limit: int, *, stale_after: timedelta, now: datetime | None = None
    ) -> list[ClaimedWork]:
        """Reclaim up to ``limit`` processing rows whose heartbeat is older than
        ``stale_after``.

        The lost attempt counts (``attempt`` goes up by one) only when its prepare had
        started; a claim lost before that raises ``lost_unstarted`` instead
        (``STALE_VARIANTS``). The ``UPDATE`` itself tells the two apart, so a late start
        marker cannot slip between a read and the write. Each lost attempt gets a history
        entry (in memory: the runner writes it before the work runs again).
        """
        if limit <= 0 or self._idle():
            return []
        cutoff = now - stale_after if now is not None else now_plus(-stale_after)
        works: list[ClaimedWork] = []
        # A claim lost before its attempt started is no attempt of a Django task either:
        # the new claim takes its place in worker_ids instead of adding to them.
        (started, counted), (unstarted, uncounted) = STALE_VARIANTS
        replaced = JSONAppend(JSONDropLast("worker_ids"), self.worker_id)
        variants = ((started, counted), (unstarted, {**uncounted, "worker_ids": replaced}))
        if self.flow is not None:
            works = self.flow.claim_stale(self, limit, cutoff=cutoff, variants=variants)
        if len(works) < limit and self._has_plain():
            stale = DeferredWork.objects.using(self.using).stale(cutoff)
            works += self._claim(
                stale, limit - len(works), ("heartbeat_at",), reclaimed=True, variants=variants
            )
        for work in works:
            work.lost_started = work.claim_variant == 0
            if work.lost_started:
                entry = {"attempt": work.attempt - 1, "started": True}
                error = "the runner stopped heart-beating"
            else:
                entry = {"attempt": work.attempt, "started": False}
                error = "the runner stopped heart-beating before this attempt started; not counted"
            work.history = append_entry(work.history, outcome="lost", error=error, **entry)
            work.history_changed = True
        return works


def _can_return_from_update(using: str) -> bool:
    # PostgreSQL, and SQLite from 3.35 (when it learnt RETURNING, for INSERT and UPDATE alike).
    connection = connections[using]
    return (
        connection.vendor in ("postgresql", "sqlite") and connection.features.can_return_columns_from_insert
    )


def _update_returning(
    queryset: Any, changes: dict[str, Any], using: str, names: Sequence[str] = (*_CLAIM_FIELDS, *_TASK_FIELDS)
) -> list[dict[str, Any]]:
    """``queryset.update(**changes)`` that returns the updated rows' ``names`` (the first
    is always ``"pk"``; by default ``_CLAIM_FIELDS``): the
    ORM compiles the ``UPDATE`` (so the candidate conditions stay defined in one place) and
    ``RETURNING`` saves reading the rows back with a second query."""
    connection = connections[using]
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(changes)
    sql, params = query.get_compiler(using).as_sql()
    fields = [DeferredWork._meta.get_field(name) for name in names[1:]]
    quote = connection.ops.quote_name
    columns = [DeferredWork._meta.pk.column, *(f.column for f in fields)]
    sql = f"{sql} RETURNING {', '.join(quote(column) for column in columns)}"
    # Raw values get the conversions the ORM would apply (JSON text decoded, SQLite's
    # datetime text parsed).
    converters = []
    for f in fields:
        col = f.get_col(DeferredWork._meta.db_table)
        converters.append((col, [*connection.ops.get_db_converters(col), *col.get_db_converters(connection)]))
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned = cursor.fetchall()
    rows = []
    for pk, *values in returned:
        row = {"pk": pk}
        for f, (col, convert), value in zip(fields, converters, values, strict=True):
            for converter in convert:
                value = converter(value, col, connection)
            row[f.name] = value
        rows.append(row)
    return rows


# --- Fenced writes --------------------------------------------------------------------


def validate_patch(patch: Any) -> dict[str, Any]:
    if not isinstance(patch, dict):
        raise InvalidCheckpoint(
            f"save() takes a dict of checkpoint names to JSON values; got {type(patch).__name__}"
        )
    for key in patch:
        if not isinstance(key, str):
            raise InvalidCheckpoint(f"save() takes string checkpoint names; got a {type(key).__name__} key")
    # The same rules as triggers: what is journalled comes back exactly, or is refused.
    try:
        json_values.check(patch)
    except json_values.Rejected as problem:
        raise InvalidCheckpoint(
            f"save() takes JSON values only, ones that come back exactly: the patch {problem}; "
            f"{json_values.ALLOWED}"
        ) from None
    return json.loads(json_values.dumps(patch))


def save_checkpoints(work: ClaimedWork, patch: Any) -> dict[str, Any]:
    """Merge ``patch`` into the journal durably; raises :class:`ClaimLost`."""
    clean = validate_patch(patch)
    merged = {**work.checkpoints, **clean}
    matched = work.fenced().update(
        checkpoints=merged,
        heartbeat_at=DatabaseNow(),
        updated_at=DatabaseNow(),
        # A save proves the attempt started: it counts if its runner is lost.
        started_at=Coalesce(F("started_at"), DatabaseNow()),
    )
    if matched != 1:
        raise ClaimLost(
            f"{work.kind} #{work.id}: this attempt no longer holds the work (it was "
            "reclaimed or changed by someone else); checkpoints not saved"
        )
    work.checkpoints = merged
    return clean


def finish_done(works: Iterable[ClaimedWork]) -> tuple[list[ClaimedWork], list[ClaimedWork]]:
    """Mark finished work done; returns ``(written, lost)``.

    Rows of one claim are written by one statement. When it matches fewer rows than
    it was given, the rows it did write are the ones it returned (``RETURNING``) or,
    elsewhere, the ones stamped with its ``updated_at``.
    """
    written: list[ClaimedWork] = []
    lost: list[ClaimedWork] = []
    by_claim: dict[tuple[str, str], list[ClaimedWork]] = {}
    for work in works:
        if work.history_changed:
            (written if _finish_one(work) else lost).append(work)
        else:
            by_claim.setdefault((work.using, work.claim_token), []).append(work)
    for (using, token), group in by_claim.items():
        ids = [work.id for work in group]
        rows = DeferredWork.objects.using(using).held(token).filter(pk__in=ids)
        returned = {"return_value": _return_values(group)}
        if _can_return_from_update(using):
            done = {**_done_fields(DatabaseNow()), **returned}
            ours = {row["pk"] for row in _update_returning(rows, done, using, ("pk",))}
        else:
            now = database_now(using)
            if rows.update(**_done_fields(now), **returned) == len(group):
                ours = set(ids)
            else:
                ours = set(
                    DeferredWork.objects.using(using)
                    .filter(pk__in=ids, status=Status.DONE, updated_at=now)
                    .values_list("pk", flat=True)
                )
        for work in group:
            (written if work.id in ours else lost).append(work)
    return written, lost


def _return_values(group: list[ClaimedWork]) -> Any:
    """What each row of one done-write returned: one constant when they agree (no-op
    tasks and workflows return None), else a CASE on the id."""
    values = [work.return_value for work in group]
    if all(value is None for value in values):
        return None
    return Case(
        *(When(pk=work.id, then=Value(work.return_value, output_field=JSONField())) for work in group),
        default=Value(None, output_field=JSONField()),
        output_field=JSONField(),
    )


def _failure_fields(work: ClaimedWork, error: str) -> dict[str, Any]:
    """A Django task's failed attempt adds an entry to its ``errors``."""
    if not work.is_task:
        return {}
    record = work.error_record or {
        "exception_class_path": f"{WorkerLost.__module__}.{WorkerLost.__qualname__}",
        "traceback": error,
    }
    return {"errors": JSONAppend("errors", record)}


def _unclaimed(now: Any) -> dict[str, Any]:
    """The fields every write that ends an attempt sets: the claim is given up."""
    return {
        "claim_token": "",
        "claimed_at": None,
        "heartbeat_at": None,
        "started_at": None,
        "updated_at": now,
    }


def _done_fields(now: Any) -> dict[str, Any]:
    return {"status": Status.DONE, "last_error": "", "finished_at": now, **_unclaimed(now)}


def _finish_one(work: ClaimedWork) -> bool:
    return (
        work.fenced().update(
            history=work.history, return_value=_return_values([work]), **_done_fields(DatabaseNow())
        )
        == 1
    )


def reschedule(work: ClaimedWork, *, delay: timedelta, error: str) -> bool:
    history = append_entry(work.history, attempt=work.attempt, outcome="rescheduled", error=error)
    return (
        work.fenced().update(
            status=Status.PENDING,
            attempt=work.attempt + 1,
            next_attempt_at=now_plus(delay),
            last_error=error,
            history=history,
            **_failure_fields(work, error),
            **_unclaimed(DatabaseNow()),
        )
        == 1
    )


def release_after_outage(work: ClaimedWork, *, delay: timedelta, error: str) -> bool:
    """The attempt failed only because the database was unreachable: pending again
    soon, attempt unchanged, and the history says so."""
    history = append_entry(
        work.history, attempt=work.attempt, outcome="released", reason="database unavailable", error=error
    )
    return (
        work.fenced().update(
            status=Status.PENDING,
            next_attempt_at=now_plus(delay),
            last_error=error,
            history=history,
            **_unclaimed(DatabaseNow()),
        )
        == 1
    )


def abandon(work: ClaimedWork, *, error: str, reason: str) -> bool:
    history = append_entry(
        work.history, attempt=work.attempt, outcome="abandoned", reason=reason, error=error
    )
    return (
        work.fenced().update(
            status=Status.ABANDONED,
            last_error=error,
            history=history,
            finished_at=DatabaseNow(),
            **_failure_fields(work, error),
            **_unclaimed(DatabaseNow()),
        )
        == 1
    )


def record_lost(work: ClaimedWork) -> bool:
    """Write the history of a reclaimed row (its lost attempt) before it runs again."""
    if not work.history_changed:
        return True
    if work.fenced().update(history=work.history) != 1:
        return False
    work.history_changed = False
    return True


def release(works: Iterable[ClaimedWork]) -> int:
    """Give claims back at shutdown: pending, due now, attempt unchanged."""
    released = 0
    by_claim: dict[tuple[str, str], list[int]] = {}
    for work in works:
        by_claim.setdefault((work.using, work.claim_token), []).append(work.id)
    for (using, token), ids in by_claim.items():
        released += (
            DeferredWork.objects.using(using)
            .held(token)
            .filter(pk__in=ids)
            .update(
                status=Status.PENDING,
                next_attempt_at=DatabaseNow(),
                # The claim did not start an attempt: it does not count as one.
                worker_ids=JSONDropLast("worker_ids"),
                **_unclaimed(DatabaseNow()),
            )
        )
    return released


def _still_processing(works: Sequence[ClaimedWork], using: str) -> Any:
    """The rows of ``works`` still held by one of their claims (one statement for many
    claims: a token of another row cannot match, the ids keep the rows apart)."""
    tokens = {work.claim_token for work in works}
    return DeferredWork.objects.using(using).filter(
        pk__in=[work.id for work in works], claim_token__in=tokens, status=Status.PROCESSING
    )


def heartbeat(works: Sequence[ClaimedWork], *, using: str) -> int:
    """Refresh ``heartbeat_at`` of every row still held; returns rows refreshed."""
    if not works:
        return 0
    return _still_processing(works, using).update(heartbeat_at=DatabaseNow())


def mark_started(works: Sequence[ClaimedWork], *, using: str) -> int:
    """Record that these attempts' prepare started: from now on, losing them counts."""
    if not works:
        return 0
    return _still_processing(works, using).filter(started_at__isnull=True).update(started_at=DatabaseNow())

"""Claiming deferred work and every fenced write that follows a claim.

A claim is a compare-and-set ``UPDATE`` that moves due (or stale) rows to ``processing``
and stamps them with a fresh claim token. Every later write of that attempt filters on
``id`` *and* the token and is judged by the rows it matched: a write that matches
nothing means the claim was lost (another runner reclaimed the work, or an operator
changed it), and nothing was written.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.db.models.sql import UpdateQuery
from django.utils import timezone

from .exceptions import ClaimLost, InvalidCheckpoint
from .flow.claiming import FlowClaimer
from .history import append_entry
from .models import DeferredWork, Status

_CLAIM_FIELDS = ("pk", "kind", "dedupe_key", "trigger", "checkpoints", "attempt", "history")

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
    # Set when ``history`` gained entries that only an individual write can persist.
    history_changed: bool = False
    using: str = "default"

    def fenced(self) -> Any:
        """The queryset matching this row only while our claim holds."""
        return DeferredWork.objects.using(self.using).held(self.claim_token).filter(pk=self.id)


class Claimer:
    """Claims batches of due and stale work for one runner."""

    def __init__(self, *, kinds: Sequence[str], using: str) -> None:
        self.kinds = list(kinds)
        self.using = using
        self.contended = False
        # Kinds with flow limits are claimed by the flow claimer, only as far as their
        # limits let them start; every other kind keeps the plain claim below.
        self.flow = FlowClaimer.for_kinds(self.kinds, using)
        self.plain_kinds = [k for k in self.kinds if not self.flow or k not in self.flow.kinds]

    def _claim(
        self, candidates: Any, limit: int, order_by: str, *, reclaimed: bool, **changes: Any
    ) -> list[ClaimedWork]:
        """Compare-and-set up to ``limit`` rows of ``candidates`` to a new claim token and
        return them as claimed.

        The ids are read first and the ``UPDATE`` names them as literals and re-checks the
        candidate conditions, so its plan is a primary-key lookup whatever the table's
        statistics say (a one-statement ``UPDATE … IN (SELECT … LIMIT)`` can get a
        nested-loop plan on a freshly filled table and take hundreds of milliseconds).
        Where the database can, the ``UPDATE`` returns the rows it claimed
        (``RETURNING``); elsewhere they are read back by their token.
        """
        candidates = candidates.filter(kind__in=self.plain_kinds)
        spread = _CONTENTION_SPREAD if self.contended else 1
        ids = list(candidates.order_by(order_by).values_list("pk", flat=True)[: limit * spread])
        if spread > 1 and len(ids) > limit:
            ids = random.sample(ids, limit)
        if not ids:
            return []
        return self.claim_rows(candidates, ids, reclaimed=reclaimed, **changes)

    def claim_rows(
        self, candidates: Any, ids: list[int], *, reclaimed: bool, **changes: Any
    ) -> list[ClaimedWork]:
        """Compare-and-set the rows ``ids`` of ``candidates`` (the conditions are checked
        again by the ``UPDATE``) to a new claim token; returns those it got."""
        token = uuid.uuid4().hex
        claimed_at = timezone.now()
        changes.update(
            claim_token=token, claimed_at=claimed_at, heartbeat_at=claimed_at, updated_at=claimed_at
        )
        claimed = candidates.filter(pk__in=ids)
        if _can_return_from_update(self.using):
            rows = _update_returning(claimed, changes, self.using)
        else:
            matched = claimed.update(**changes)
            rows = self._load(ids, token) if matched else []
        self.contended = len(rows) < len(ids)
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
                using=self.using,
            )
            for row in rows
        ]

    def _load(self, ids: list[int], token: str) -> list[dict[str, Any]]:
        rows = DeferredWork.objects.using(self.using).held(token).filter(pk__in=ids)
        return list(rows.values(*_CLAIM_FIELDS))

    def claim_due(
        self, limit: int, *, now: datetime | None = None, startable: int | None = None
    ) -> list[ClaimedWork]:
        """Claim up to ``limit`` pending rows whose time has come, oldest first; of kinds
        with flow limits, at most ``startable`` (the runner's free threads)."""
        if limit <= 0 or not self.kinds:
            return []
        works: list[ClaimedWork] = []
        if self.flow is not None:
            # Limited kinds: only what their limits let start now.
            startable = limit if startable is None else min(limit, startable)
            works = self.flow.claim_due(self, limit, now, startable)
            limit -= len(works)
        if limit > 0 and self.plain_kinds:
            due = DeferredWork.objects.using(self.using).due(now or timezone.now())
            works += self._claim(due, limit, "next_attempt_at", reclaimed=False, status=Status.PROCESSING)
        return works

    def retry_in(self) -> float | None:
        """Seconds until a rate window the last claim found full has a start again."""
        return self.flow.retry_in if self.flow is not None else None

    def claim_stale(
        self, limit: int, *, stale_after: timedelta, now: datetime | None = None
    ) -> list[ClaimedWork]:
        """Reclaim up to ``limit`` processing rows whose heartbeat is older than
        ``stale_after``; the lost attempt counts, so ``attempt`` goes up by one."""
        if limit <= 0 or not self.kinds:
            return []
        cutoff = (now or timezone.now()) - stale_after
        works: list[ClaimedWork] = []
        if self.flow is not None:
            works = self.flow.claim_stale(self, limit, cutoff=cutoff)
        if len(works) < limit and self.plain_kinds:
            stale = DeferredWork.objects.using(self.using).stale(cutoff)
            works += self._claim(
                stale, limit - len(works), "heartbeat_at", reclaimed=True, attempt=F("attempt") + 1
            )
        for work in works:
            work.history = append_entry(
                work.history,
                attempt=work.attempt - 1,
                outcome="lost",
                error="the runner stopped heart-beating",
            )
            work.history_changed = True
        return works


def _can_return_from_update(using: str) -> bool:
    # PostgreSQL, and SQLite from 3.35 (when it learnt RETURNING, for INSERT and UPDATE alike).
    connection = connections[using]
    return (
        connection.vendor in ("postgresql", "sqlite") and connection.features.can_return_columns_from_insert
    )


def _update_returning(queryset: Any, changes: dict[str, Any], using: str) -> list[dict[str, Any]]:
    """``queryset.update(**changes)`` that returns the updated rows' ``_CLAIM_FIELDS``: the
    ORM compiles the ``UPDATE`` (so the candidate conditions stay defined in one place) and
    ``RETURNING`` saves reading the rows back with a second query."""
    connection = connections[using]
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(changes)
    sql, params = query.get_compiler(using).as_sql()
    fields = [DeferredWork._meta.get_field(name) for name in _CLAIM_FIELDS[1:]]
    quote = connection.ops.quote_name
    columns = [DeferredWork._meta.pk.column, *(field.column for field in fields)]
    sql = f"{sql} RETURNING {', '.join(quote(column) for column in columns)}"
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned = cursor.fetchall()
    rows = []
    for pk, *values in returned:
        row = {"pk": pk}
        for field, value in zip(fields, values, strict=True):
            # The JSON columns come back as text, as they do to the ORM; it decodes them so.
            from_db = getattr(field, "from_db_value", None)
            row[field.name] = from_db(value, None, connection) if from_db else value
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
    try:
        return json.loads(json.dumps(patch, allow_nan=False))
    except (TypeError, ValueError):
        raise InvalidCheckpoint(
            "save() takes JSON values only (dicts, lists, strings, finite numbers, "
            "booleans, None); the patch holds something else"
        ) from None


def save_checkpoints(work: ClaimedWork, patch: Any) -> dict[str, Any]:
    """Merge ``patch`` into the journal durably; raises :class:`ClaimLost`."""
    clean = validate_patch(patch)
    merged = {**work.checkpoints, **clean}
    now = timezone.now()
    matched = work.fenced().update(checkpoints=merged, heartbeat_at=now, updated_at=now)
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
    it was given, the rows it did write are told apart by their ``updated_at``.
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
        now = timezone.now()
        ids = [work.id for work in group]
        matched = DeferredWork.objects.using(using).held(token).filter(pk__in=ids).update(**_done_fields(now))
        if matched == len(group):
            written.extend(group)
            continue
        ours = set(
            DeferredWork.objects.using(using)
            .filter(pk__in=ids, status=Status.DONE, updated_at=now)
            .values_list("pk", flat=True)
        )
        for work in group:
            (written if work.id in ours else lost).append(work)
    return written, lost


def _unclaimed(now: datetime) -> dict[str, Any]:
    """The fields every write that ends an attempt sets: the claim is given up."""
    return {"claim_token": "", "claimed_at": None, "heartbeat_at": None, "updated_at": now}


def _done_fields(now: datetime) -> dict[str, Any]:
    return {"status": Status.DONE, "last_error": "", **_unclaimed(now)}


def _finish_one(work: ClaimedWork) -> bool:
    return work.fenced().update(history=work.history, **_done_fields(timezone.now())) == 1


def reschedule(work: ClaimedWork, *, delay: timedelta, error: str) -> bool:
    now = timezone.now()
    history = append_entry(work.history, attempt=work.attempt, outcome="rescheduled", error=error)
    return (
        work.fenced().update(
            status=Status.PENDING,
            attempt=work.attempt + 1,
            next_attempt_at=now + delay,
            last_error=error,
            history=history,
            **_unclaimed(now),
        )
        == 1
    )


def abandon(work: ClaimedWork, *, error: str, reason: str) -> bool:
    now = timezone.now()
    history = append_entry(
        work.history, attempt=work.attempt, outcome="abandoned", reason=reason, error=error
    )
    return (
        work.fenced().update(
            status=Status.ABANDONED,
            last_error=error,
            history=history,
            **_unclaimed(now),
        )
        == 1
    )


def release(works: Iterable[ClaimedWork]) -> int:
    """Give claims back at shutdown: pending, due now, attempt unchanged."""
    released = 0
    by_claim: dict[tuple[str, str], list[int]] = {}
    for work in works:
        by_claim.setdefault((work.using, work.claim_token), []).append(work.id)
    for (using, token), ids in by_claim.items():
        now = timezone.now()
        released += (
            DeferredWork.objects.using(using)
            .held(token)
            .filter(pk__in=ids)
            .update(status=Status.PENDING, next_attempt_at=now, **_unclaimed(now))
        )
    return released


def heartbeat(works: Sequence[ClaimedWork], *, using: str) -> int:
    """Refresh ``heartbeat_at`` of every row still held; returns rows refreshed."""
    if not works:
        return 0
    tokens = {work.claim_token for work in works}
    ids = [work.id for work in works]
    return (
        DeferredWork.objects.using(using)
        .filter(pk__in=ids, claim_token__in=tokens, status=Status.PROCESSING)
        .update(heartbeat_at=timezone.now())
    )

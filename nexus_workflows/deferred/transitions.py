"""The state machine of a :class:`DeferredWork` row: every change of its status, each one
named function here, with its compare-and-set (and, after a claim, its fence) inside it.

    enqueue ─► pending ─claim─► processing ─done────────► done ──purge─► (gone)
                 ▲  ▲               │  ▲ ─abandon─────► abandoned ──purge─► (gone)
                 │  └─reschedule────┤  └─reclaim (stale heartbeat)      │
                 │  └─release───────┘                                   │
                 └──────────────revive──────────────────────────────────┘
              run now: pending ─► pending, due now

* ``enqueue``: :func:`nexus_workflows.deferred.inserts.insert_pending` (new rows take the
  model's default status, pending; nothing here is a change of one).
* ``claim`` / ``reclaim``: :func:`claim` (the runner's :class:`~nexus_workflows.deferred.claims.Claimer`
  picks the rows; this writes them, re-checking the candidates' conditions).
* ``save``, ``done``, ``reschedule``, ``abandon``, ``release``: fenced by the claim token
  (:meth:`ClaimedWork.fenced`) and judged by the rows matched: a write that matches
  nothing means the claim was lost, and nothing was written. The row keeps the token of
  the claim whose write ended its attempt (done, abandoned, or pending again), so such a
  write sent again (its first commit's answer lost in an outage) is told from a lost
  claim (:func:`_written_by`); no fence matches that token, each needs "processing" too.
* ``revive``, ``run now``: compare-and-set on the status the operator saw.
* ``purge``: :func:`purge`, re-checking status and expiry in the ``DELETE``.

Nothing outside this module writes ``status`` (``tests/test_transitions.py`` checks).
Every time written here comes from the database (``DatabaseNow()``), never from a host.
"""

# Long module: the state machine: every transition of a row in one module.

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Case, DateTimeField, F, JSONField, Q, QuerySet, Value, When
from django.db.models.functions import Coalesce

from nexus_workflows import json_values, sql
from nexus_workflows.clock import DatabaseNow, database_now, now_plus
from nexus_workflows.deferred.expressions import JSONAppend, JSONDropLast
from nexus_workflows.deferred.history import append_entry
from nexus_workflows.exceptions import ClaimLost, InvalidCheckpoint, WorkerLost
from nexus_workflows.flow import starts
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.sql.returning import PrecompiledUpdate, can_return_from_update, update_returning


@dataclass
class ClaimedWork:
    """A row this runner holds, as it was read at claim time. Its ``repr`` shows the kind,
    id, attempt and claim, never the data (an error tracker may print it)."""

    id: int
    kind: str
    dedupe_key: str = field(repr=False)
    trigger: Any = field(repr=False)
    checkpoints: dict[str, Any] = field(repr=False)
    attempt: int
    history: list[Any] = field(repr=False)
    claim_token: str
    reclaimed: bool = False
    # Reclaimed only: whether the lost attempt's prepare had started (then it counted).
    lost_started: bool = False
    # Claims of this row lost before their prepare started (bounded by the guard).
    lost_unstarted: int = 0
    # Which of the claim's variants took the row (see ``Claimer.claim_rows``).
    claim_variant: int = 0
    # When (monotonic) the claim's statement was sent: the heartbeat it stamped is no
    # older, however long the statement then waited (a lock, a stalled commit).
    sent_at: float | None = None
    # Set when ``history`` gained entries that only an individual write can persist.
    history_changed: bool = False
    using: str = "default"
    # The _TASK_FIELDS columns as the claim left them.
    columns: dict[str, Any] = field(default_factory=dict, repr=False)
    # Set by an attempt of a Django task (nexus_workflows.tasks) for the outcome write:
    # what it returned, how it failed ({"exception_class_path", "traceback"}), and the
    # TaskResult its signals carry.
    return_value: Any = field(default=None, repr=False)
    error_record: dict[str, str] | None = field(default=None, repr=False)
    task_result: Any = field(default=None, repr=False)
    # The stored ``finished_at`` once done or abandoned was written (the database's clock),
    # so that task_finished carries what get_result() reads. A Django task's only: a
    # workflow row's done-write leaves it None (nothing reads it).
    finished_at: datetime | None = field(default=None, repr=False)
    # A rate-limited kind's start of its window, reserved by the claim and taken when the
    # attempt starts (nexus_workflows.flow.starts); None once started, or without a limit.
    reservation: Any = None
    # Once started: (reservation, row, stamp) of its window start, until confirmed.
    window_start: Any = None
    # Claimed by flow control: it holds a slot, a serial key or a reserved start from its
    # claim, so the runner hands it to a worker ahead of plain work (runner.ledger).
    limited: bool = False
    # The runner's lane for it (runner.lanes.lane_of), decided once: the ledger counts it
    # in that lane from its dispatch to its outcome, and asks several times per item.
    lane: str | None = field(default=None, repr=False)

    @property
    def is_task(self) -> bool:
        """A Django task's row: its kind is an import path (workflow kinds have no dot)."""
        return "." in self.kind

    @property
    def backend_name(self) -> str:
        """A Django task's backend alias ("" for a registered workflow): its attempts count
        against that task's schedule."""
        return str(self.columns.get("backend_name") or "")

    def fenced(self) -> Any:
        """The queryset matching this row only while our claim holds."""
        return DeferredWork.objects.using(self.using).held(self.claim_token).filter(pk=self.id)

    @property
    def key(self) -> tuple[str, int]:
        """This attempt, as opposed to this row: a row may be claimed again."""
        return (self.claim_token, self.id)


# --- Claims, revives, run now and purge ----------------------------------------------------


def claim(
    candidates: QuerySet[DeferredWork], changes: dict[str, Any], names: Sequence[str]
) -> list[dict[str, Any]] | None:
    """pending (or stale processing) → processing: compare-and-set the rows of ``candidates``
    (whose conditions the ``UPDATE`` re-checks) with ``changes`` (a new claim token among
    them). Returns the claimed rows' ``names`` where the database can say which rows it
    wrote (``RETURNING``); ``None`` elsewhere, when the caller reads them back by token
    (and nothing is known if nothing matched: then it returns ``[]``)."""
    changes = {**changes, "status": Status.PROCESSING}
    if can_return_from_update(candidates.db):
        return update_returning(candidates, changes, names)
    return None if candidates.update(**changes) else []


def claim_statement(
    candidates: QuerySet[DeferredWork], changes: dict[str, Any], names: Sequence[str], slots: Sequence[Any]
) -> PrecompiledUpdate:
    """:func:`claim` compiled once, for the wake-up's claim by id: the same compare-and-set
    (``changes`` with the status set to processing), run later with the values of
    ``slots`` (placeholders among ``changes`` and ``candidates``' filters) bound anew.
    Only where :func:`can_return_from_update` holds.

    Its commit waits for the WAL flush like every claim: a claim lost in a crash of
    PostgreSQL after the runner started the attempt would let another runner claim the row
    while the attempt still runs (two executions at once)."""
    return PrecompiledUpdate(candidates, {**changes, "status": Status.PROCESSING}, names, slots)


def revive(queryset: QuerySet[DeferredWork], *, due: Any = None, history: list[Any] | None = None) -> int:
    """abandoned → pending: compare-and-set abandoned rows of ``queryset`` back to pending
    (attempt 0, due at ``due`` or now, error and claim cleared, checkpoints kept); returns
    rows revived. Rows that are not abandoned (a runner may be working on them) are left
    alone; ``queryset`` may add its own conditions (the ``updated_at`` the caller read)."""
    # The database the UPDATE goes to: queryset.db names the router's read database until
    # update() runs; a queryset for writing (never evaluated here) names the write one.
    with _values_apart(queryset.select_for_update().db):
        return queryset.filter(status=Status.ABANDONED).update(**_revived(due, history))


def revive_ids(queryset: QuerySet[DeferredWork], *, due: Any = None, by: str) -> set[int]:
    """:func:`revive` of each abandoned row of ``queryset``, its history saying it was
    revived ``by`` whom; which rows it revived (those changed since they were read: purged,
    revived and claimed by someone else, are not among them). One ``UPDATE`` per row, a
    compare-and-set on the ``updated_at`` read, so the history written extends exactly
    the history read (reviving abandoned work is rare; a lost entry is not)."""
    rows = queryset.filter(status=Status.ABANDONED).values("pk", "history", "updated_at")
    return {
        row["pk"]
        for row in rows
        if revive(
            queryset.filter(pk=row["pk"], updated_at=row["updated_at"]),
            due=due,
            history=append_entry(row["history"], event="revived", by=by),
        )
    }


def _revived(due: Any, history: list[Any] | None) -> dict[str, Any]:
    now = DatabaseNow()
    fields: dict[str, Any] = {
        "status": Status.PENDING,
        "attempt": 0,
        "lost_unstarted": 0,
        "next_attempt_at": due if due is not None else now,
        "last_error": "",
        "finished_at": None,
        # A revived row starts afresh: no claim wrote its state (see _written_by).
        "claim_token": "",
        **_unclaimed(now),
    }
    if history is not None:
        fields["history"] = history
    return fields


def run_now(queryset: QuerySet[DeferredWork]) -> int:
    """pending → pending, due now: compare-and-set on the status; attempt and history kept.
    Returns rows changed."""
    return queryset.filter(status=Status.PENDING).update(
        next_attempt_at=DatabaseNow(), updated_at=DatabaseNow()
    )


def purge(expired: QuerySet[DeferredWork], ids: list[int]) -> int:
    """done/abandoned → gone: delete the rows ``ids`` of ``expired`` (whose status and
    expiry the ``DELETE`` re-checks, so a row revived meanwhile stays). One statement,
    never Django's collector, which deletes by primary key only whenever a delete signal
    receiver is connected: no delete signals, as ``update()`` sends no save signals."""
    # _raw_delete: DELETE … WHERE id IN (…) AND status IN (…) AND updated_at < cutoff. A
    # private QuerySet method: the public delete() cannot keep the WHERE clause (see above).
    return expired.filter(pk__in=ids)._raw_delete(expired.db)


# --- An attempt's fenced writes: save, done, reschedule, release, abandon ----------------


def validate_patch(patch: Any, using: str) -> dict[str, Any]:
    """The patch as it will be journalled on the database ``using``, or
    :class:`InvalidCheckpoint` saying which rule it broke (never its values)."""
    if not isinstance(patch, dict):
        raise InvalidCheckpoint(
            f"save() takes a dict of checkpoint names to JSON values; got {type(patch).__name__}"
        )
    for key in patch:
        if not isinstance(key, str):
            raise InvalidCheckpoint(f"save() takes string checkpoint names; got a {type(key).__name__} key")
    # The same rules as triggers: what is journalled comes back exactly, or is refused.
    # The journal nests as deep as the patch (it is merged at the top level).
    max_depth = sql.json_depth(using)
    try:
        json_values.check(patch, max_depth=max_depth)
    except json_values.Rejected as problem:
        raise InvalidCheckpoint(
            f"save() takes JSON values only, ones that come back exactly: the patch {problem}; "
            f"{json_values.allowed(max_depth)}"
        ) from None
    return json.loads(json_values.dumps(patch))


def save_checkpoints(work: ClaimedWork, patch: Any) -> dict[str, Any]:
    """Merge ``patch`` into the journal durably; raises :class:`ClaimLost`."""
    clean = validate_patch(patch, work.using)
    merged = {**work.checkpoints, **clean}
    with _values_apart(work.using):
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


@dataclass(frozen=True)
class JournalsWritten:
    """What a batch of saves did: the rows ``written``, and the rows ``held``: skipped
    because another session holds a lock on them while their claim still holds (a plain
    read), to be written later (:func:`save_journals`). Any other row's claim was lost."""

    written: set[int]
    held: set[int] = field(default_factory=set)


def save_journals(saves: Sequence[tuple[ClaimedWork, dict[str, Any]]], *, using: str) -> JournalsWritten:
    """Write many attempts' merged journals at once (the runner's journal writer), each
    fenced like :func:`save_checkpoints`; at most one save per row. Each row written also
    gets a fresh heartbeat and counts as started.

    A row another session holds a lock on (an operator's open transaction, a backfill, the
    heartbeat's beat) is skipped, not waited for, where the database can (PostgreSQL,
    MariaDB 10.6+): waiting for it held every other save of the batch (up to 200 attempts)
    back for as long as the lock was held. Such rows come back as ``held``."""
    skips = _skips_locked_rows(using)
    statements = sql.for_connection(using)
    with statements.values_sent_apart(using):
        if hasattr(statements, "save_journals"):  # one statement, SKIP LOCKED within it
            written = statements.save_journals(
                using,
                [work.id for work, _ in saves],
                [work.claim_token for work, _ in saves],
                [journal for _, journal in saves],
            )
        else:
            written = _save_journals_one_by_one(saves, using, skip_locked=skips)
    unwritten = [work for work, _ in saves if work.id not in written]
    if not (skips and unwritten):
        return JournalsWritten(written)
    # A row skipped for a lock whose claim still holds; a row gone or claimed again is lost.
    return JournalsWritten(written, set(_still_processing(unwritten, using).values_list("pk", flat=True)))


def _save_journals_one_by_one(
    saves: Sequence[tuple[ClaimedWork, dict[str, Any]]], using: str, *, skip_locked: bool
) -> set[int]:
    """:func:`save_journals` through the ORM, one fenced ``UPDATE`` per save in one
    transaction, after one locking read that skips the rows another session holds."""
    written = set()
    with transaction.atomic(using=using):
        free = None
        if skip_locked:
            free = _free_of_locks(DeferredWork.objects.using(using).filter(pk__in=[w.id for w, _ in saves]))
        for work, journal in saves:
            if free is not None and work.id not in free:
                continue
            if work.fenced().update(
                checkpoints=Value(journal, output_field=JSONField()),
                heartbeat_at=DatabaseNow(),
                updated_at=DatabaseNow(),
                started_at=Coalesce(F("started_at"), DatabaseNow()),
            ):
                written.add(work.id)
    return written


def save_journal_waiting(work: ClaimedWork, journal: dict[str, Any], *, at_most: float) -> bool:
    """One save written alone, fenced, waiting for its row's lock at most ``at_most``
    seconds (less where the session's own limit is lower), then raising the database's
    lock error (PostgreSQL 55P03, MariaDB 1205): the journal writer's save of a row another
    session held (``runner.held_saves``). True when the fence held."""
    with sql.for_connection(work.using).lock_waits_at_most(work.using, at_most), _values_apart(work.using):
        return bool(_save_journals_one_by_one([(work, journal)], work.using, skip_locked=False))


def lock_wait_limit(using: str) -> float | None:
    """Seconds a statement of the session of ``using`` may wait for a row lock before the
    database ends it: the least of PostgreSQL's ``lock_timeout`` and ``statement_timeout``,
    or of MariaDB's ``innodb_lock_wait_timeout`` and ``max_statement_time``, that is set;
    None when nothing ends the wait (or the database has no row locks)."""
    statements = sql.for_connection(using)
    return statements.lock_wait_limit(using) if hasattr(statements, "lock_wait_limit") else None


def finish_done(works: Iterable[ClaimedWork]) -> tuple[list[ClaimedWork], list[ClaimedWork]]:
    """Mark finished work done; returns ``(written, lost)``.

    Rows of one claim are written by one statement. When it matches fewer rows than
    it was given, the rows it did write are the ones it returned (``RETURNING``), and
    elsewhere those :func:`_written_by` finds. Rows this claim had already made done count
    as written too: a retry of a done whose commit's answer was lost (an outage) matches
    nothing, and is no lost claim.
    """
    written: list[ClaimedWork] = []
    lost: list[ClaimedWork] = []
    by_claim: dict[tuple[str, str], list[ClaimedWork]] = {}
    for work in works:
        if work.history_changed:
            finished = _finish_one(work) or _written_by_this_claim(work, status=Status.DONE)
            (written if finished else lost).append(work)
        else:
            by_claim.setdefault((work.using, work.claim_token), []).append(work)
    for (using, token), group in by_claim.items():
        ids = [work.id for work in group]
        rows = sql.for_connection(using).of_ids(DeferredWork.objects.using(using).held(token), ids)
        done = {**_done_fields(DatabaseNow()), "return_value": _return_values(group)}
        # What each written row stores as finished_at, by id: only a Django task's is
        # read (task_finished), so a claim of workflow rows returns their ids alone.
        ours: dict[int, Any] = {}
        with _values_apart(using):
            if not can_return_from_update(using):
                rows.update(**done)  # which rows it wrote, and their finished_at, are read below
            elif any(work.is_task for work in group):
                returning = update_returning(rows, done, ("pk", "finished_at"))
                ours = {row["pk"]: row["finished_at"] for row in returning}
            else:
                ours = dict.fromkeys(row["pk"] for row in update_returning(rows, done, ("pk",)))
        if len(ours) < len(group):
            missing = [pk for pk in ids if pk not in ours]
            ours.update(_written_by(using, token, missing, status=Status.DONE))
        for work in group:
            if work.id in ours:
                work.finished_at = ours[work.id]
                written.append(work)
            else:
                lost.append(work)
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


def _values_apart(using: str) -> AbstractContextManager[None]:
    """Writes of journals, errors, histories and return values send their values apart
    from the statement's text where the database would log a failed statement with them
    (PostgreSQL: ``sql.postgresql.values_sent_apart``), so patient data stays out of it."""
    return sql.for_connection(using).values_sent_apart(using)


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
    """The fields every write that ends an attempt sets: the claim is given up. Its token
    stays, saying which claim wrote the row's outcome (:func:`_written_by`); no fence
    matches it, as every one needs the status "processing" too, and every claim writes
    its own."""
    return {
        "claimed_at": None,
        "heartbeat_at": None,
        "started_at": None,
        "updated_at": now,
    }


def _done_fields(now: Any) -> dict[str, Any]:
    return {"status": Status.DONE, "last_error": "", "finished_at": now, **_unclaimed(now)}


def _written_by(using: str, token: str, ids: list[int], **outcome: Any) -> dict[int, Any]:
    """The rows of ``ids`` whose attempt the claim ``token`` ended with ``outcome`` (the
    status, and the attempt where it tells), with their stored ``finished_at``.

    Read when a write of the claim's outcome matched nothing: its first commit may have
    gone through with its answer lost (an outage), and the write sent again finds the row
    no longer processing. Only that claim's own outcome write leaves a row out of
    "processing" with its token: a later claim writes its own, a revive clears it. So a
    row found here was written by this claim. Once another runner claimed the row again
    (pending work may be claimed at once), its token replaced ours and nothing can tell:
    the write counts as lost, as before.
    """
    return dict(
        DeferredWork.objects.using(using)
        .filter(pk__in=ids, claim_token=token, **outcome)
        .values_list("pk", "finished_at")
    )


def _written_by_this_claim(work: ClaimedWork, **outcome: Any) -> bool:
    """:func:`_written_by` for one row; keeps its stored ``finished_at`` on ``work``."""
    found = _written_by(work.using, work.claim_token, [work.id], **outcome)
    if work.id not in found:
        return False
    work.finished_at = found[work.id]
    return True


def _finish_one(work: ClaimedWork) -> bool:
    return _write_final(
        work,
        lambda now: {"history": work.history, "return_value": _return_values([work]), **_done_fields(now)},
    )


def _write_final(work: ClaimedWork, changes: Callable[[Any], dict[str, Any]]) -> bool:
    """The fenced write of a final outcome, ``changes(now)`` (``finished_at`` among them);
    keeps the stored ``finished_at`` on ``work``: ``RETURNING`` where the database can,
    else the database's time read first and written as a value."""
    if can_return_from_update(work.using):
        with _values_apart(work.using):
            rows = update_returning(work.fenced(), changes(DatabaseNow()), ("pk", "finished_at"))
        if len(rows) != 1:
            return False
        work.finished_at = rows[0]["finished_at"]
        return True
    now = database_now(work.using)
    with _values_apart(work.using):
        if work.fenced().update(**changes(now)) != 1:
            return False
    work.finished_at = now
    return True


def reschedule(work: ClaimedWork, *, delay: timedelta, error: str) -> bool:
    """processing → pending after ``delay``, ``attempt + 1``. Whether it was written: by
    this write, or by this claim's same write before, whose answer was lost (an outage)."""
    history = append_entry(work.history, attempt=work.attempt, outcome="rescheduled", error=error)
    with _values_apart(work.using):
        matched = work.fenced().update(
            status=Status.PENDING,
            attempt=work.attempt + 1,
            next_attempt_at=now_plus(delay),
            last_error=error,
            history=history,
            **_failure_fields(work, error),
            **_unclaimed(DatabaseNow()),
        )
    return matched == 1 or _written_by_this_claim(work, status=Status.PENDING, attempt=work.attempt + 1)


def release_attempt(work: ClaimedWork, *, delay: timedelta, reason: str, error: str) -> bool:
    """processing → pending after ``delay``, attempt unchanged: the attempt did not count
    (``reason``, one of the runner's own, says why: the database was unreachable, or its
    reserved start lapsed before it started; the history keeps it)."""
    history = append_entry(work.history, attempt=work.attempt, outcome="released", reason=reason, error=error)
    starts.give_back([work])
    with _values_apart(work.using):
        matched = work.fenced().update(
            status=Status.PENDING,
            next_attempt_at=now_plus(delay),
            last_error=error,
            history=history,
            **_unclaimed(DatabaseNow()),
        )
    # Written before, its answer lost (see reschedule)?
    return matched == 1 or _written_by_this_claim(work, status=Status.PENDING, attempt=work.attempt)


def abandon(work: ClaimedWork, *, error: str, reason: str, unrun: bool = False) -> bool:
    """processing → abandoned; keeps the stored ``finished_at`` on ``work``. Whether it
    was written: by this write, or by this claim's same write before, whose answer was
    lost (an outage). ``unrun``: this claim ran nothing (the crash-loop guard gives up a
    reclaimed row), so a Django task's ``worker_ids`` drops the runner it appended: its
    attempts are the runs it had."""
    history = append_entry(
        work.history, attempt=work.attempt, outcome="abandoned", reason=reason, error=error
    )
    starts.give_back([work])
    unrun_claim = {"worker_ids": JSONDropLast("worker_ids")} if unrun and work.is_task else {}
    written = _write_final(
        work,
        lambda now: {
            "status": Status.ABANDONED,
            "last_error": error,
            "history": history,
            "finished_at": now,
            **_failure_fields(work, error),
            **_unclaimed(now),
            **unrun_claim,
        },
    )
    return written or _written_by_this_claim(work, status=Status.ABANDONED)


def record_lost(work: ClaimedWork) -> bool:
    """Write the history of a reclaimed row (its lost attempt) before it runs again."""
    if not work.history_changed:
        return True
    with _values_apart(work.using):
        if work.fenced().update(history=work.history) != 1:
            return False
    work.history_changed = False
    return True


def release(works: Iterable[ClaimedWork]) -> int:
    """Give claims back at shutdown: pending, due now, attempt unchanged. Returns how many
    this claim gave back, counting those an earlier try wrote whose answer was lost."""
    released = 0
    works = list(works)
    starts.give_back(works)  # their attempts never started: nor did their rate starts
    by_claim: dict[tuple[str, str], list[int]] = {}
    for work in works:
        by_claim.setdefault((work.using, work.claim_token), []).append(work.id)
    for (using, token), ids in by_claim.items():
        matched = DeferredWork.objects.using(using).held(token).filter(pk__in=ids).update(**_given_back())
        if matched < len(ids):
            # Rows pending with this token now: this write's and an earlier try's. At least
            # ``matched`` (a row this write gave back may be claimed again already).
            matched = max(matched, len(_written_by(using, token, ids, status=Status.PENDING)))
        released += matched
    return released


def release_unanswered(using: str, tokens: Collection[str]) -> int:
    """Give back what claims whose answer was lost took (the database ran them, then the
    connection went away before the rows came back): nothing of theirs was handed out,
    so nothing runs them. Pending again, due now, as :func:`release`; returns how many.
    A token another claim replaced since (a reclaim) no longer matches its rows."""
    if not tokens:
        return 0
    held = DeferredWork.objects.using(using).filter(claim_token__in=list(tokens), status=Status.PROCESSING)
    return held.update(**_given_back())


def _given_back() -> dict[str, Any]:
    """What a claim given back before its attempt started writes: pending, due now."""
    return {
        "status": Status.PENDING,
        "next_attempt_at": DatabaseNow(),
        # The claim did not start an attempt: it does not count as one.
        "worker_ids": JSONDropLast("worker_ids"),
        **_unclaimed(DatabaseNow()),
        **_unstamped_if_first_claim(),
    }


def _unstamped_if_first_claim() -> dict[str, Any]:
    """A released claim that was a Django task's first (its ``worker_ids`` held only this
    claim's runner) takes its stamps back: a READY task that never ran has no start, and
    the next claim stamps its own first start."""
    only_claim = Q(worker_ids__1__isnull=True)  # no second element
    return {
        field: Case(When(only_claim, then=Value(None)), default=F(field), output_field=DateTimeField())
        for field in ("first_started_at", "last_attempted_at")
    }


def _still_processing(works: Sequence[ClaimedWork], using: str) -> Any:
    """The rows of ``works`` still held by one of their claims (one statement for many
    claims: a token of another row cannot match, the ids keep the rows apart)."""
    tokens = {work.claim_token for work in works}
    return DeferredWork.objects.using(using).filter(
        pk__in=[work.id for work in works], claim_token__in=tokens, status=Status.PROCESSING
    )


def _skips_locked_rows(using: str) -> bool:
    """Whether ``using`` can pass over rows another session holds a lock on (PostgreSQL,
    MariaDB 10.6+). SQLite has no row locks: one writer at a time, which a write waits for."""
    return bool(connections[using].features.has_select_for_update_skip_locked)


def _free_of_locks(rows: QuerySet[DeferredWork]) -> set[int]:
    """The ids of ``rows`` no other session holds a row lock on, locked now for the
    caller's transaction, with the lock an ``UPDATE`` takes."""
    no_key = connections[rows.db].features.has_select_for_no_key_update
    locked = rows.order_by().select_for_update(skip_locked=True, no_key=no_key)
    return set(locked.values_list("pk", flat=True))


def heartbeat(works: Sequence[ClaimedWork], *, using: str) -> set[int]:
    """Refresh ``heartbeat_at`` of every row of ``works`` still held; returns the ids
    refreshed. A row another session holds a lock on (an operator's open transaction, a
    backfill) is skipped, not waited for: waiting for it held every other row's beat back
    until they went stale, and another runner reclaimed attempts still running here.
    :func:`heartbeat_waiting` beats the rows skipped."""
    if not works:
        return set()
    rows = _still_processing(works, using)
    if not _skips_locked_rows(using):
        if can_return_from_update(using):  # SQLite: the rows refreshed, read back
            return {row["pk"] for row in update_returning(rows, {"heartbeat_at": DatabaseNow()}, ["pk"])}
        rows.update(heartbeat_at=DatabaseNow())  # MariaDB before 10.6: as it always was
        return {work.id for work in works}
    with transaction.atomic(using=using):
        free = _free_of_locks(rows)
        if free:
            sql.for_connection(using).of_ids(DeferredWork.objects.using(using), list(free)).update(
                heartbeat_at=DatabaseNow()
            )
    return free


def heartbeat_waiting(works: Sequence[ClaimedWork], *, using: str) -> set[int]:
    """Refresh ``heartbeat_at`` of the rows of ``works`` still held, waiting for their row
    locks (the caller bounds the wait): queued on a lock, this runner's beat takes the row
    as soon as its holder lets it go, before a stale claim of another runner (which skips
    a locked row) can. Returns the ids refreshed (a row lost meanwhile is not one)."""
    rows = _still_processing(works, using)
    if can_return_from_update(using):
        return {row["pk"] for row in update_returning(rows, {"heartbeat_at": DatabaseNow()}, ["pk"])}
    with transaction.atomic(using=using):
        held = set(rows.order_by().select_for_update().values_list("pk", flat=True))  # waits
        if held:
            sql.for_connection(using).of_ids(DeferredWork.objects.using(using), list(held)).update(
                heartbeat_at=DatabaseNow()
            )
    return held


def mark_started(works: Sequence[ClaimedWork], *, using: str) -> set[int]:
    """Record that these attempts' prepare started: from now on, losing them counts.
    Returns the ids dealt with; a row another session holds a lock on is left for a later
    turn (as a heartbeat leaves it: waiting for it would hold the beats back)."""
    if not works:
        return set()
    ids = {work.id for work in works}
    if _skips_locked_rows(using):
        # A plain read first (it waits for no lock and writes nothing): most rows are marked
        # already (a save marks its row), and a row locked for nothing would be a write, its
        # commit waiting for a synchronous standby as any write's does.
        unmarked = _still_processing(works, using).filter(started_at__isnull=True)
        wanted = set(unmarked.values_list("pk", flat=True))
        if wanted:
            with transaction.atomic(using=using):
                free = _free_of_locks(DeferredWork.objects.using(using).filter(pk__in=wanted))
                _mark([work for work in works if work.id in free], using)
            ids -= wanted - free
        works = [work for work in works if work.id in ids]
    else:
        _mark(works, using)
    starts.confirm(works)  # rate-limited attempts: running by now (flow.starts.confirm)
    return ids


def _mark(works: Sequence[ClaimedWork], using: str) -> None:
    if works:
        _still_processing(works, using).filter(started_at__isnull=True).update(started_at=DatabaseNow())

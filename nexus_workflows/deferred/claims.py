"""Which rows a runner claims: due work in priority order, stale work to reclaim, and the
spread that keeps runners sharing a table from colliding.

The writes themselves, the claim's compare-and-set and every fenced write that follows
it, are the row's state machine in :mod:`nexus_workflows.deferred.transitions` (re-exported here,
where the runner and the tests have always found them).

Every time written comes from the database (``DatabaseNow()``), never from the runner's
host: runners on hosts whose clocks disagree still agree on what is due and what is stale.
"""

# Long module: the Claimer: its due, stale and by-id claims, and the columns each writes.

from __future__ import annotations

import contextlib
import random
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, transaction
from django.db.models import Case, F, Field, Q, When
from django.db.models.functions import Coalesce

from nexus_workflows import sql
from nexus_workflows.clock import DatabaseNow, now_plus
from nexus_workflows.database_errors import is_database_unavailable
from nexus_workflows.deferred.expressions import JSONAppend, JSONDropLast
from nexus_workflows.deferred.history import append_entry
from nexus_workflows.deferred.transitions import (
    ClaimedWork,
    claim,
    claim_statement,
)
from nexus_workflows.flow.claiming import FlowClaimer
from nexus_workflows.models import DeferredWork
from nexus_workflows.sql.returning import PrecompiledUpdate, can_return_from_update

if TYPE_CHECKING:
    from nexus_workflows.flow.windows import Reservation

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
    # Earlier attempts' errors: a retry's TaskResult shows them, as get_result() does.
    "errors",
)


_ONE_VARIANT: tuple[tuple[Q | None, dict[str, Any]], ...] = ((None, {}),)

#: A reclaim counts the lost attempt only if its prepare had started (``started_at`` set);
#: otherwise it counts a claim lost before starting (bounded by the crash-loop guard).
STALE_VARIANTS: tuple[tuple[Q | None, dict[str, Any]], ...] = (
    (Q(started_at__isnull=False), {"attempt": F("attempt") + 1}),
    (Q(started_at__isnull=True), {"lost_unstarted": F("lost_unstarted") + 1}),
)

# The wake-up's claim by id of workflow rows is compiled once per number of ids up to this
# many (a NOTIFY names one row); its placeholders, the token and the ids, are bound anew.
_PRECOMPILED_IDS = 4
_TOKEN_SLOT = "nexus-workflows:claim-token-slot"
_ID_SLOT = -(2**62)

# When a claim loses rows to another runner, the next claims pick at random among this
# many times more candidates, so that runners sharing a table stop colliding.
_CONTENTION_SPREAD = 4


def _claim_changes(token: str) -> dict[str, Any]:
    """What every claim writes besides the status (:func:`transitions.claim` sets it)."""
    return {
        "claim_token": token,
        "claimed_at": DatabaseNow(),
        "heartbeat_at": DatabaseNow(),
        "updated_at": DatabaseNow(),
        # This attempt's prepare has not started yet (the marker is written once it has).
        "started_at": None,
    }


#: What a claim of a kind without flow limits writes besides: no slot and no serial key.
#: A row enqueued or rescheduled while its kind had them keeps them, and two such rows
#: claimed together would collide in the unique indexes that guard them
#: (``nw_flow_slot_held_once``, ``nw_serial_key_running_once``) on every claim.
NO_FLOW_LIMITS: dict[str, Any] = {"flow_slot": None, "serial_key_hash": None}


class ClaimInterrupted(Exception):
    """A claim raised ``error`` (a lock wait cut short, an outage) after some of its
    statements had committed: ``works`` are claimed all the same. The runner hands them
    out before it handles ``error``: dropped, they would sit processing, holding their
    slots, serial keys and reserved starts, until they went stale."""

    def __init__(self, works: list[ClaimedWork], error: Exception) -> None:
        super().__init__(f"{len(works)} item(s) claimed before the claim failed ({type(error).__name__})")
        self.works = works
        self.error = error


class Claimer:
    """Claims batches of due and stale work for one runner."""

    def __init__(
        self,
        *,
        kinds: Sequence[str],
        using: str,
        queues: Sequence[str] | None = (),
        worker_id: str = "",
        on_unanswered: Callable[[str, Sequence[Reservation]], None] | None = None,
    ) -> None:
        self.kinds = list(kinds)
        # Django task queues to take: a list, or None for every queue. Tasks have no flow
        # limits: they always take the plain claim.
        self.queues = None if queues is None else list(queues)
        self.using = using
        self.worker_id = worker_id or uuid.uuid4().hex
        self.contended = False
        # Told the token of a claim whose answer an outage may have lost after the database
        # ran it (the runner gives back what it took: :mod:`.runner.unanswered`). Over a
        # network only: SQLite's answers come from this process.
        self._on_unanswered = on_unanswered if connections[using].vendor != "sqlite" else None
        # Kinds with flow limits are claimed by the flow claimer, only as far as their
        # limits let them start; every other kind keeps the plain claim below.
        self.flow = FlowClaimer.for_kinds(self.kinds, using)
        self.plain_kinds = [k for k in self.kinds if not self.flow or k not in self.flow.kinds]
        self._by_id: dict[int, PrecompiledUpdate] = {}  # number of ids -> its claim

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
        read: Callable[[int], list[tuple[int, str]] | None] | None = None,
        **changes: Any,
    ) -> list[ClaimedWork]:
        """Compare-and-set up to ``limit`` rows of ``candidates`` (of the kinds without flow
        limits) to a new claim token and return them as claimed. ``read(n)``, when it
        answers, gives the ``(id, queue_name)`` of the first ``n`` candidates in
        ``order_by``'s order instead of the ORM's read.

        The ids are read first and the ``UPDATE`` names them as literals and re-checks the
        candidate conditions, so its plan is a primary-key lookup whatever the table's
        statistics say (a one-statement ``UPDATE … IN (SELECT … LIMIT)`` can get a
        nested-loop plan on a freshly filled table and take hundreds of milliseconds).
        """
        candidates = candidates.filter(self._selection())
        spread = _CONTENTION_SPREAD if self.contended else 1
        found: list[Any] | None = read(limit * spread) if read is not None else None
        if found is None:
            fields = ("pk", "queue_name") if self.queues != [] else ("pk",)
            found = list(candidates.order_by(*order_by).values_list(*fields)[: limit * spread])
        if spread > 1 and len(found) > limit:
            found = [found[index] for index in sorted(random.sample(range(len(found)), limit))]
        if not found:
            return []
        ids = [row[0] for row in found]
        tasks = {row[0] for row in found if row[1:] and row[1]}
        return self.claim_rows(
            candidates, ids, reclaimed=reclaimed, variants=variants, tasks=tasks, **NO_FLOW_LIMITS, **changes
        )

    def claim_rows(
        self,
        candidates: Any,
        ids: list[int],
        *,
        reclaimed: bool,
        variants: Sequence[tuple[Q | None, dict[str, Any]]] = _ONE_VARIANT,
        tasks: set[int] | None = None,
        **changes: Any,
    ) -> list[ClaimedWork]:
        """Compare-and-set the rows ``ids`` of ``candidates`` (the conditions are checked
        again by the ``UPDATE``) to a new claim token; returns those it got.

        Where the database can, the ``UPDATE`` returns the rows it claimed
        (``RETURNING``); elsewhere they are read back by their token. ``variants`` split
        the ``UPDATE`` by a condition re-checked in it, each with changes of its own; each
        claimed row says which one claimed it (``claim_variant``). ``tasks``: which of
        ``ids`` are Django tasks' rows, when the caller knows (``None``: any may be, if
        this runner takes task queues); see ``_task_changes``.
        """
        token = uuid.uuid4().hex
        changes.update(_claim_changes(token))
        if self.queues == []:
            tasks = set()
        some = None if tasks is None else bool(tasks)  # None: perhaps
        every = tasks is not None and len(tasks) == len(ids)
        names = _CLAIM_FIELDS if some is False else (*_CLAIM_FIELDS, *_TASK_FIELDS)
        sent_at = time.monotonic()  # the claim's heartbeat stamp is no older (see Ledger.dispatch)
        try:
            with self._one_transaction(several=len(variants) > 1):
                # Rows another session holds a lock on are skipped, not waited for.
                claimable = sql.for_connection(self.using).claimable(candidates, ids)
                found = self._claim_variants(claimable, ids, token, variants, names, some, every, changes)
        except Exception as error:
            if not reclaimed:
                self.note_unanswered(token, error)
            raise
        self.contended = len(found) < len(ids)
        # Hand them out in the claim's order (priority first): RETURNING keeps no order.
        position = {pk: index for index, pk in enumerate(ids)}
        found.sort(key=lambda item: position.get(item[0]["pk"], len(ids)))
        return [self._claimed(row, index, token, reclaimed, sent_at) for row, index in found]

    def _one_transaction(self, *, several: bool) -> Any:
        """One transaction for a claim of several statements (an ``UPDATE`` per variant;
        where there is no ``RETURNING``, the read of its rows by token after each): in
        autocommit, a statement that fails after an earlier one committed would leave
        the rows that one claimed processing, never handed out nor heart-beaten, holding
        their slots and keys until ``STALE_AFTER``. In a transaction the failure rolls the
        claim back (a session that died is rolled back by the server), and the rows stay
        pending, or stale, for the next claim. One ``UPDATE … RETURNING`` needs none.
        Inside a caller's transaction the claim is already one (the caller's)."""
        connection = connections[self.using]
        if connection.in_atomic_block or not (several or not can_return_from_update(self.using)):
            return contextlib.nullcontext()
        return transaction.atomic(using=self.using)

    def note_unanswered(self, token: str, error: Exception, reservations: Sequence[Reservation] = ()) -> None:
        """A claim of due work raised ``error``; when the database went away, it may have
        run the claim before the answer was lost: nothing was handed out, and the runner
        gives back what it took under ``token`` once the database answers again (else it
        would sit processing, holding slots and keys, until ``STALE_AFTER``). Not for a
        reclaim: pending again, its row would skip the crash-loop guard and the history
        entry of the attempt it counted lost; it goes stale again, as at a shutdown.
        ``reservations``: the rate-window starts the claim reserved in its transaction."""
        if self._on_unanswered is not None and is_database_unavailable(error):
            self._on_unanswered(token, reservations)

    def _claim_variants(
        self,
        claimed: Any,
        ids: list[int],
        token: str,
        variants: Sequence[tuple[Q | None, dict[str, Any]]],
        names: Sequence[str],
        some: bool | None,
        every: bool,
        changes: dict[str, Any],
    ) -> list[tuple[dict[str, Any], int]]:
        """One compare-and-set per variant; each claimed row with its variant's index."""
        found: list[tuple[dict[str, Any], int]] = []
        for index, (condition, extra) in enumerate(variants):
            subset = claimed.filter(condition) if condition is not None else claimed
            rows = claim(subset, self._task_changes({**changes, **extra}, some=some, every=every), names)
            if rows is None:  # no RETURNING here: read back by token what this variant took
                before = {row["pk"] for row, _ in found}
                rows = [row for row in self._load(ids, token, names) if row["pk"] not in before]
            found.extend((row, index) for row in rows)
        return found

    def _claimed(
        self, row: dict[str, Any], index: int, token: str, reclaimed: bool, sent_at: float
    ) -> ClaimedWork:
        return ClaimedWork(
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
            sent_at=sent_at,
            using=self.using,
            columns={name: row[name] for name in _TASK_FIELDS if name in row},
        )

    def _task_changes(self, changes: dict[str, Any], *, some: bool | None, every: bool) -> dict[str, Any]:
        """``changes`` plus the columns of a Django task's ``TaskResult``, on task rows only.

        A task's claim also stamps its first and latest attempt and appends this runner to
        its ``worker_ids`` (a ``worker_ids`` in ``changes`` replaces the append). Workflow
        rows never read those columns, and writing them cost every workflow claim ~15% of
        the no-op drain: a claim of workflow rows only (``some`` is False) leaves them out
        of its ``UPDATE``; one of task rows only (``every``) writes them; one that may take
        both writes them through a ``CASE`` on the row being a task's (``queue_name`` set).
        """
        task_only = {
            "first_started_at": Coalesce(F("first_started_at"), DatabaseNow()),
            "last_attempted_at": DatabaseNow(),
            "worker_ids": changes.pop("worker_ids", None) or JSONAppend("worker_ids", self.worker_id),
        }
        if some is False:
            return changes
        if not every:

            def field_of(name: str) -> Field[Any, Any]:
                return cast("Field[Any, Any]", DeferredWork._meta.get_field(name))  # each name is a column

            task_only = {
                name: Case(When(queue_name="", then=F(name)), default=value, output_field=field_of(name))
                for name, value in task_only.items()
            }
        return {**changes, **task_only}

    def _load(self, ids: list[int], token: str, names: Sequence[str]) -> list[dict[str, Any]]:
        rows = DeferredWork.objects.using(self.using).held(token).filter(pk__in=ids)
        return list(rows.values(*names))

    def claim_due(
        self,
        limit: int,
        *,
        now: datetime | None = None,
        startable: int | None = None,
        plain: bool = True,
    ) -> list[ClaimedWork]:
        """Claim up to ``limit`` pending rows whose time has come (by the database's clock,
        or ``now``): highest priority first (Django tasks; workflows are all 0), then the
        longest due (the order of ``nw_due_idx``); of kinds with flow limits, at most
        ``startable`` (what the runner can start at once). Without ``plain``, only kinds
        with flow limits. Raises :class:`ClaimInterrupted` when it fails after claiming
        some."""
        if limit <= 0 or self._idle():
            return []
        works: list[ClaimedWork] = []
        try:
            if self.flow is not None:
                # Limited kinds: only what their limits let start now.
                startable = limit if startable is None else min(limit, startable)
                self.flow.claim_due(self, limit, now, startable, works)
            if plain and limit > len(works) and self._has_plain():
                due = DeferredWork.objects.using(self.using).due(now or DatabaseNow())
                order = ("-priority", "next_attempt_at")
                read = self._due_reader(now)
                works += self._claim(due, limit - len(works), order, reclaimed=False, read=read)
        except Exception as error:
            if works:
                raise ClaimInterrupted(works, error) from error
            raise
        return works

    def _due_reader(self, now: datetime | None) -> Callable[[int], list[tuple[int, str]] | None]:
        """The claim's read of due rows where the database merges one ordered read per
        kind and per task queue (PostgreSQL, MariaDB): due rows of kinds and queues this runner
        does not take are never walked past. Elsewhere it answers None (the ORM's read)."""
        backend = sql.for_connection(self.using)

        def read(limit: int) -> list[tuple[int, str]] | None:
            return backend.due_ids(self.using, self.plain_kinds, self.queues, now, limit)

        return read

    def takes_by_id(self, kind: str, queue: str | None = None) -> bool:
        """Whether a row of ``kind`` may be claimed by id (:meth:`claim_due_ids`): a kind
        of this claimer without flow limits, or a Django task of a queue it takes (of any
        queue when ``queue`` is None, not known: the claim re-checks the row's queue)."""
        if "." in kind:
            if queue is None or self.queues is None:
                return self.queues != []
            return queue in self.queues
        return kind in self.plain_kinds

    def claim_due_ids(self, ids: list[int], *, now: datetime | None = None) -> list[ClaimedWork]:
        """Claim the rows ``ids`` if they are still pending, due and of this claimer's
        selection (of kinds without flow limits): one ``UPDATE … RETURNING``, no ``SELECT``
        first; the wake-up path for a row whose NOTIFY named it."""
        if not ids or not self._has_plain():
            return []
        due = DeferredWork.objects.using(self.using).due(now or DatabaseNow()).filter(self._selection())
        return self.claim_rows(due, ids, reclaimed=False, **NO_FLOW_LIMITS)

    def claim_workflow_ids(self, ids: list[int]) -> list[ClaimedWork]:
        """Claim the workflow rows ``ids`` (of kinds without flow limits) if they are still
        pending and due by the database's clock: the wake-up path of an idle runner, one
        ``UPDATE … RETURNING`` compiled once (:func:`transitions.claim_statement`), so a
        claim costs its round trip and little else. A row of a Django task is not taken
        (:meth:`claim_due_ids` takes those)."""
        if not ids or not self.plain_kinds:
            return []
        if len(ids) > _PRECOMPILED_IDS or not can_return_from_update(self.using):
            due = DeferredWork.objects.using(self.using).due(DatabaseNow())
            workflows = due.filter(kind__in=self.plain_kinds, queue_name="")
            return self.claim_rows(workflows, ids, reclaimed=False, tasks=set(), **NO_FLOW_LIMITS)
        statement = self._by_id.get(len(ids))
        if statement is None:
            statement = self._by_id[len(ids)] = self._claim_by_id_statement(len(ids))
        token = uuid.uuid4().hex
        sent_at = time.monotonic()
        try:
            rows = statement.run([token, *ids])
        except Exception as error:
            self.note_unanswered(token, error)
            raise
        self.contended = len(rows) < len(ids)
        position = {pk: index for index, pk in enumerate(ids)}
        rows.sort(key=lambda row: position[row["pk"]])
        return [self._claimed(row, 0, token, False, sent_at) for row in rows]

    def _claim_by_id_statement(self, count: int) -> PrecompiledUpdate:
        slots = [_ID_SLOT + number for number in range(count)]
        due = DeferredWork.objects.using(self.using).due(DatabaseNow())
        workflows = due.filter(kind__in=self.plain_kinds, queue_name="")
        # The ids (slots) appear once, in the subquery that skips locked rows (PostgreSQL).
        workflows = sql.for_connection(self.using).claimable(workflows, slots)
        changes = {**_claim_changes(_TOKEN_SLOT), **NO_FLOW_LIMITS}
        return claim_statement(workflows, changes, _CLAIM_FIELDS, [_TOKEN_SLOT, *slots])

    def retry_in(self) -> float | None:
        """Seconds until a rate window the last claim found full has a start again."""
        return self.flow.retry_in if self.flow is not None else None

    def claim_stale(
        self,
        limit: int,
        *,
        stale_after: timedelta,
        now: datetime | None = None,
        startable: int | None = None,
        plain: bool = True,
    ) -> list[ClaimedWork]:
        """Reclaim up to ``limit`` processing rows whose heartbeat is older than
        ``stale_after``; of kinds with flow limits, at most ``startable`` (what the runner
        can start at once: a reclaim holds their slots, keys and rate-window starts, which
        must not wait in a queue). Without ``plain``, only kinds with flow limits.

        The lost attempt counts (``attempt`` goes up by one) only when its prepare had
        started; a claim lost before that raises ``lost_unstarted`` instead
        (``STALE_VARIANTS``). The ``UPDATE`` itself tells the two apart, so a late start
        marker cannot slip between a read and the write. Each lost attempt gets a history
        entry (in memory: the runner writes it before the work runs again). Raises
        :class:`ClaimInterrupted` when it fails after reclaiming some.
        """
        if limit <= 0 or self._idle():
            return []
        cutoff = now - stale_after if now is not None else now_plus(-stale_after)
        works: list[ClaimedWork] = []
        # A claim lost before its attempt started is no attempt of a Django task either:
        # the new claim takes its place in worker_ids instead of adding to them.
        (started, counted), (unstarted, uncounted) = STALE_VARIANTS
        # (_task_changes writes worker_ids of task rows only.)
        replaced = JSONAppend(JSONDropLast("worker_ids"), self.worker_id)
        variants = ((started, counted), (unstarted, {**uncounted, "worker_ids": replaced}))
        try:
            if self.flow is not None:
                flow_limit = limit if startable is None else min(limit, startable)
                self.flow.claim_stale(
                    self, flow_limit, cutoff=cutoff, variants=variants, works=works, once=now is not None
                )
            if plain and len(works) < limit and self._has_plain():
                stale = DeferredWork.objects.using(self.using).stale(cutoff)
                works += self._claim(
                    stale, limit - len(works), ("heartbeat_at",), reclaimed=True, variants=variants
                )
        except Exception as error:
            if works:
                raise ClaimInterrupted(_with_losses(works), error) from error
            raise
        return _with_losses(works)


def _with_losses(works: list[ClaimedWork]) -> list[ClaimedWork]:
    """Reclaimed ``works``, each with its lost attempt in its history (see
    :meth:`Claimer.claim_stale`)."""
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

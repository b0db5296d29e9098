"""Claiming work of kinds with limits: only what can start now, decided by the database.

The runner's plain claim (``claims.Claimer``) takes due rows oldest first. For a kind
with flow limits the same claim is narrowed, in this order:

* **serial key**: a row whose key has a processing row, or an earlier-enqueued ready row
  (``ordered``: any earlier pending or processing row), is not a candidate; so at most
  one row per key is picked, the earliest enqueued. Earlier-enqueued is a lower id, and
  the ids of one key follow the commit order of their enqueues (``flow.ordering``). The partial unique index
  ``nw_serial_key_running_once`` makes a second processing row of a key impossible even
  when two runners pick at the same instant: the second claim fails and is retried.
* **concurrency**: the free slot numbers ``0 … N-1`` are read and one is written into
  each claimed row (``flow_slot``); the partial unique index ``nw_flow_slot_held_once``
  holds a slot to one processing row. A slot is given back by the write that ends the
  attempt and kept by a reclaim, so a dead runner's slots come back exactly when its work
  is reclaimed.
* **rate**: a start of the kind's (or the rate key's) sliding window is reserved for
  each row in the same transaction as the claim; if fewer are granted than rows were
  claimed, the whole transaction is rolled back and the claim retried smaller, so no
  claim is made without its start. The reservation becomes the start when the attempt
  starts (``flow.starts.begin``, on the database clock), so the window counts the
  attempts' own start stamps, not their claims.

Nothing here locks rows (no ``SELECT … FOR UPDATE``): unique constraints and
compare-and-set updates decide, as everywhere else in the app.
"""

# Long module: flow control's claims: slots, keys and rate windows in one claim.

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, connections, transaction
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Min,
    OuterRef,
    Q,
    Subquery,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from nexus_workflows import sql
from nexus_workflows.clock import DatabaseNow
from nexus_workflows.flow import windows
from nexus_workflows.models import DeferredWork, FlowWindowSlot, Status

if TYPE_CHECKING:
    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.deferred.registry import Workflow
    from nexus_workflows.deferred.transitions import ClaimedWork
    from nexus_workflows.flow.options import FlowLimits

logger = logging.getLogger(__name__)

# Rounds of read-then-claim when another runner took a slot, a key or a start first.
_ROUNDS = 6
# Seconds a kind with nothing due (or a full rate window) is not asked again by one
# runner: a busy runner claims many times a second, and asking every idle limited kind
# each time halved the drain of unlimited kinds. A rest ends early when the kind could
# have something (:meth:`FlowClaimer.wake`: a NOTIFY naming it, or one naming no kind;
# one of the runner's own attempts of it ended), and a full window's when it frees; so
# this is the longest extra wait only for work no wake-up announced (a busy runner's,
# whose enqueues need not NOTIFY, or a delayed item coming due).
_REST = 0.2
# Seconds added to how long ago a claim read its candidates, when it looks for rows that
# came due since (the database's clock and ours tick apart by about a millisecond).
_CLOCK_MARGIN = 0.01
# Candidates read per row wanted when a rate key may be full: enough to find rows of
# other keys behind a key that has used its window.
_RATE_KEY_SPREAD = 4
# After losing rows to another runner, pick at random among this many times more.
_SPREAD = 4


def window_name(kind: str) -> str:
    """The sliding window of a kind's ``rate_limit`` (per rate key hash)."""
    return f"workflow:{kind}"


def now_or_database(now: datetime | None) -> Any:
    return now if now is not None else DatabaseNow()


class _Shortfall(Exception):
    """The rate window granted fewer starts than rows were claimed: roll back."""

    def __init__(self, granted: int) -> None:
        self.granted = granted


def key_conditions(kind: str, flow: FlowLimits, now: Any) -> Q:
    """Rows of ``kind`` whose serial key lets them start now (everything, without a key).

    Written as two uncorrelated subqueries (the keys that are running; the first row of
    each key) rather than correlated ``NOT EXISTS``: each is computed once per claim, so
    the plan stays linear whatever the table's statistics say (a freshly filled table
    gets a nested-loop anti-join from ``NOT EXISTS`` that takes seconds).
    """
    if flow.serial_key is None:
        return Q()
    of_kind = DeferredWork.objects.filter(kind=kind, serial_key_hash__isnull=False).order_by()
    running_keys = of_kind.filter(status=Status.PROCESSING).values("serial_key_hash")
    if flow.ordered:
        # The earliest pending or processing row of each key; if that row is processing,
        # no pending row of the key is first.
        waiting = of_kind.filter(status__in=[Status.PENDING, Status.PROCESSING])
    else:
        # The earliest ready row of each key.
        waiting = of_kind.filter(status=Status.PENDING, next_attempt_at__lte=now)
    firsts = waiting.values("serial_key_hash").annotate(first=Min("pk")).values("first")
    return Q(serial_key_hash__isnull=True) | (Q(pk__in=firsts) & ~Q(serial_key_hash__in=running_keys))


def busy_starts_subquery(kind: str, flow: FlowLimits) -> Any:
    """Starts in the window of each row's rate key (or the kind's), as a subquery: those
    of rows above the limit too (a lowered limit's), which count until they leave the
    period (``windows.free_slots`` folds them below the limit before a start)."""
    assert flow.rate_limit is not None
    _, period = flow.rate_limit
    busy = (
        FlowWindowSlot.objects.filter(
            name=window_name(kind),
            key_hash=OuterRef("window_key"),
            started_at__gt=DatabaseNow() - windows.held_for(period),
        )
        .order_by()
        .values("name")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(busy), Value(0))


def _limited(works: list[ClaimedWork]) -> list[ClaimedWork]:
    """Mark claimed ``works`` as holding a limit: the runner starts them first."""
    for work in works:
        work.limited = True
    return works


def _shifted(moment: Any, seconds: float) -> Any:
    """``moment`` (a datetime or the database's clock) ``seconds`` later (earlier if < 0)."""
    delta = timedelta(seconds=seconds)
    if isinstance(moment, datetime):
        return moment + delta
    return ExpressionWrapper(
        moment + Value(delta, output_field=DurationField()), output_field=DateTimeField()
    )


def window_key_of(row_hash: str | None) -> str:
    # An item whose rate_key returned None counts against the kind's own window.
    return row_hash or ""


class FlowClaimer:
    """Claims the due and stale work of the kinds of one runner that have limits."""

    def __init__(self, workflows: Sequence[Workflow], using: str) -> None:
        self.workflows = list(workflows)
        self.using = using
        # Each claim, due or stale, starts with the next kind (counted apart: a runner
        # makes both in one turn, and one count would start its stale claims with the
        # same kind every time, behind a kind whose claim keeps failing).
        self._turns = {"due": itertools.count(), "stale": itertools.count()}
        # Seconds until a full rate window of the last claim has a start again, if known:
        # the runner polls again then rather than after its whole poll interval.
        self.retry_in: float | None = None
        # Whether the last claim with a cutoff (``runworkflows --once``) left due rows that
        # only full rate windows held back: --once waits for them, as they will start.
        self.held_back = False
        # The same for stale rows: whether the last stale claim with a cutoff reclaimed
        # some (more may be left) or left some a full window (or the budget) held back.
        self.stale_held_back = False
        # Kinds whose last claim found nothing that could start: (since, until) monotonic.
        self._rest: dict[str, tuple[float, float]] = {}
        # Kinds that rested and have not claimed anything since: on PostgreSQL the runner
        # holds their rest locks, so enqueues of them notify it (deferred.rest_locks).
        self.quiet: set[str] = set()
        # Kinds that rest because every slot is held: on PostgreSQL the runner holds their
        # ending locks, so an attempt of them ending on another runner notifies it.
        self.full: set[str] = set()
        # When each kind (or every kind: None) was last woken (monotonic; other threads
        # write it): a wake-up after a rest began ends it, one during the claim too.
        self._woken: dict[str | None, float] = {}
        self._found_nothing = False
        self._quiet = _REST  # how long the kind rests when it found nothing
        self._slots_full = False  # whether it found nothing because every slot is held
        self._keys_busy = False  # ... or because every due row waits behind its serial key
        self._spread = False
        self._began = 0.0  # when the running claim began (monotonic)

    @classmethod
    def for_kinds(cls, kinds: Sequence[str], using: str) -> FlowClaimer | None:
        from nexus_workflows.deferred.registry import registry

        limited = [registry.get(kind) for kind in kinds if kind in registry and registry.get(kind).flow]
        return cls(limited, using) if limited else None

    @property
    def kinds(self) -> list[str]:
        return [workflow.kind for workflow in self.workflows]

    def wake(self, kind: str | None = None) -> None:
        """End the rest of ``kind`` (None: of every kind): something of it may start now
        (a wake-up named it, or named no kind; a slot, key or start of it was freed). Any
        thread; a claim of the kind running meanwhile does not begin a rest after it."""
        self._woken[kind] = time.monotonic()

    def _resting(self, kind: str, clock: float) -> float:
        """Seconds ``kind`` still rests (≤ 0: it is asked)."""
        since, until = self._rest.get(kind, (0.0, 0.0))
        if until <= clock:
            return 0.0
        if max(self._woken.get(kind, 0.0), self._woken.get(None, 0.0)) >= since:
            del self._rest[kind]
            return 0.0
        return until - clock

    def _rest_for(
        self, kind: str, since: float, seconds: float, *, new_rows_can_start: bool = True, full: bool = False
    ) -> None:
        """Rest ``kind`` ``seconds`` from ``since``. While it rests because nothing is due
        (or no due row's key has room), a new row could start: its enqueue must wake the
        runner, which holds the kind's rest lock (``quiet``). While every slot or the
        kind's one window is full, a new row could not: its enqueue need not notify. While
        every slot is held (``full``), an attempt ending anywhere frees one: the runner
        holds the kind's ending lock, so such an end notifies it."""
        self._rest[kind] = (since, since + seconds)
        if new_rows_can_start:
            self.quiet.add(kind)
        else:
            self.quiet.discard(kind)
        if full:
            self.full.add(kind)
        else:
            self.full.discard(kind)

    def _in_turn(self, claim: str) -> list[Workflow]:
        # Start with a different kind each claim, so no limited kind starves another.
        start = next(self._turns[claim]) % len(self.workflows)
        return self.workflows[start:] + self.workflows[:start]

    # --- due work -----------------------------------------------------------------------

    def claim_due(
        self, claimer: Claimer, limit: int, now: datetime | None, startable: int, works: list[ClaimedWork]
    ) -> None:
        """Claim due rows of the limited kinds into ``works``: kinds with a slot or a rate
        window only as many as the runner can start now (``startable``), so a claimed row
        never holds a slot or a counted start while it waits for a thread; serial-key-only
        kinds as many as ``limit`` (one per key), like plain kinds. Each claim's rows are
        added once it committed, so a later claim that raises leaves them there for the
        caller to hand out (``claims.ClaimInterrupted``)."""
        self.retry_in = None
        self.held_back = False
        clock = self._began = time.monotonic()
        for workflow in self._in_turn("due"):
            flow = workflow.flow
            assert flow is not None
            resting = self._resting(workflow.kind, clock)
            if resting > 0 and now is None:
                self._retry_within(resting)
                continue
            counted = flow.concurrency is not None or flow.rate_limit is not None
            budget = min(limit, startable) if counted else limit
            budget -= len(works)
            if budget > 0:
                self._found_nothing = False
                self._quiet = _REST
                self._slots_full = self._keys_busy = False
                before = len(works)
                self._claim_kind(claimer, workflow, budget, now, works)
                if len(works) > before:
                    self.quiet.discard(workflow.kind)  # asked every turn while it finds work
                    self.full.discard(workflow.kind)
                if self._found_nothing:
                    # Nothing of this kind can start: a busy runner claims its other kinds
                    # many times a second, and need not ask again for a moment.
                    # Until an attempt ends (every slot held; every due row's key busy) it
                    # holds the kind's ending lock; a new row of a free key could start.
                    full = self._slots_full
                    ends = full or self._keys_busy
                    self._rest_for(workflow.kind, clock, self._quiet, new_rows_can_start=not full, full=ends)

    def _retry_within(self, seconds: float) -> None:
        self.retry_in = seconds if self.retry_in is None else min(self.retry_in, seconds)

    def _claim_kind(
        self, claimer: Claimer, workflow: Workflow, limit: int, now: datetime | None, works: list[ClaimedWork]
    ) -> None:
        """Claim up to ``limit`` rows of one kind into ``works``, reading again (a few
        rounds) when another runner took a slot number, a key, a start or a row first: a
        runner that gives up here sleeps until its next poll while a slot may stand free."""
        claimed = 0
        self._spread = False
        for _ in range(_ROUNDS):
            wanted = limit - claimed
            if wanted <= 0:
                break
            try:
                got, asked = self._claim_kind_once(claimer, workflow, wanted, now)
            except _Shortfall as shortfall:
                claimer.contended = self._spread = True
                limit = claimed + shortfall.granted
                continue
            except IntegrityError:
                # Another runner took one of our slot numbers or keys at the same instant.
                claimer.contended = self._spread = True
                continue
            works.extend(got)  # committed: ours even if a later round raises
            claimed += len(got)
            if len(got) == asked:
                break
            claimer.contended = self._spread = True  # rows lost to another runner

    def _claim_kind_once(
        self, claimer: Claimer, workflow: Workflow, limit: int, now: datetime | None
    ) -> tuple[list[ClaimedWork], int]:
        """One read-and-claim; returns (rows claimed, rows asked for)."""
        flow = workflow.flow
        assert flow is not None
        kind = workflow.kind
        due_at = now_or_database(now)
        slots: list[int] = []
        if flow.concurrency is not None:
            slots = self.free_slots(kind, flow.concurrency)
            limit = min(limit, len(slots))
            # Every slot held: nothing of the kind can start until an attempt ends (one
            # of ours wakes the kind; another runner's NOTIFYs it, migration 0019, or is
            # seen after at most _REST without wake-ups).
            self._found_nothing = self._slots_full = not slots
        if limit <= 0:
            return [], 0
        candidates = (
            DeferredWork.objects.using(self.using)
            .filter(kind=kind, status=Status.PENDING, next_attempt_at__lte=due_at)
            .filter(key_conditions(kind, flow, due_at))
        )
        # Highest priority, then longest due, then id: on PostgreSQL a read of the kind's
        # own due rows (nw_due_kind_idx; MariaDB: nw_mariadb_due_kind_idx, migration 0018),
        # never walking past other kinds' due rows.
        ordered = sql.for_connection(self.using).due_in_order(candidates)
        ids = self._pick(kind, flow, ordered, limit)
        if not ids and now is not None and flow.rate_limit is not None:
            # --once: the candidates it found none of are held back by rate windows only.
            self.held_back = self.held_back or ordered.exists()
        if ids is None:  # a full rate window: it rests until the window frees (_pick)
            return [], 0
        if not ids:
            self._found_none(kind, flow, due_at)
            return [], 0
        # transitions.claim sets the status itself. A limit the kind no longer has is
        # cleared from the rows it claims (see claims.NO_FLOW_LIMITS).
        changes: dict[str, Any] = {} if flow.keyed else {"serial_key_hash": None}
        if flow.concurrency is None:
            changes["flow_slot"] = None
        else:
            changes["flow_slot"] = Case(
                *(When(pk=pk, then=Value(slot)) for pk, slot in zip(ids, slots, strict=False)),
                default=Value(None),
            )
        # The unique indexes guard keys and slots whatever the UPDATE re-checks, so it
        # re-checks only the due conditions (the key subqueries would double the claim's
        # cost) — except for ordered kinds, whose order no index guards: their UPDATE
        # re-checks that nothing earlier of the key became pending meanwhile.
        recheck = (
            candidates
            if flow.ordered
            else candidates.model.objects.using(self.using).filter(
                kind=kind, status=Status.PENDING, next_attempt_at__lte=due_at
            )
        )
        works = self._claim_and_start(claimer, kind, flow, recheck, ids, reclaimed=False, changes=changes)
        return works, len(ids)

    def _found_none(self, kind: str, flow: FlowLimits, due_at: Any) -> None:
        """No candidate: the kind rests. When rows are due, each waits behind its serial key
        (a processing row of the key, or an earlier one): none starts until an attempt of
        such a key ends (one of ours wakes the kind; another runner's NOTIFYs, migration
        0019) or a row of a free key is enqueued (its NOTIFY) or comes due. Nothing
        announces a delayed row coming due, so a rest that would outlast it ends then; for
        due rows behind busy keys, the first delayed row of a key not running."""
        soon = self._next_due_in(kind, due_at)
        self._found_nothing = True
        if soon is not None and soon <= 0 and flow.keyed:
            self._keys_busy = True
            soon = self._next_due_in(kind, due_at, of_free_keys=True)
        if soon is not None:
            self._quiet = min(_REST, max(soon, 0.0))
            self._retry_within(self._quiet)  # an idle runner looks again then, too

    def _next_due_in(self, kind: str, due_at: Any, *, of_free_keys: bool = False) -> float | None:
        """Seconds until the first pending row of ``kind`` is due (≤ 0: one is due now), if
        one is due within ``_REST``; None if none is. Reads no further than that (the
        due index's range), so many rows waiting for later retries cost nothing.
        ``of_free_keys``: only rows whose serial key has no processing row, not due before
        this claim began (those it read were no candidates; one that came due since is)."""
        pending = DeferredWork.objects.using(self.using).filter(
            kind=kind, status=Status.PENDING, next_attempt_at__lte=_shifted(due_at, _REST)
        )
        if of_free_keys:
            running = DeferredWork.objects.filter(
                kind=kind, status=Status.PROCESSING, serial_key_hash__isnull=False
            ).order_by()
            # The claim read its candidates a moment ago, on the same clock: go back that far.
            since = time.monotonic() - self._began + _CLOCK_MARGIN
            pending = pending.filter(next_attempt_at__gt=_shifted(due_at, -since)).exclude(
                serial_key_hash__in=running.values("serial_key_hash")
            )
        first = (
            pending.annotate(db_now=DatabaseNow())
            .order_by("next_attempt_at")
            .values_list("next_attempt_at", "db_now")
            .first()
        )
        if first is None:
            return None
        due, db_now = first
        return (due - (due_at if isinstance(due_at, datetime) else db_now)).total_seconds()

    def free_slots(self, kind: str, concurrency: int) -> list[int]:
        """Slot numbers no processing row of ``kind`` holds, in random order (so runners
        that read at the same time mostly pick different ones)."""
        held = list(
            DeferredWork.objects.using(self.using)
            .filter(kind=kind, status=Status.PROCESSING)
            .values_list("flow_slot", flat=True)
        )
        # Rows claimed before the kind had this cap (no slot number, or one at or above a
        # lowered cap) still run, and no index counts them. With k of them, only the
        # numbers 0 … N-1-k are offered: runners reading at once then collide in the
        # unique index instead of each taking a different number (N + 1 ran). Such rows
        # only end (a reclaim keeps its number), so the cap holds from any reading.
        outside = sum(1 for slot in held if slot is None or slot >= concurrency)
        taken = set(held)
        free = [slot for slot in range(concurrency - outside) if slot not in taken]
        random.shuffle(free)
        return free

    def _first(self, candidates: Any, limit: int) -> list[int]:
        """The first ``limit`` candidate ids; after losing rows to another runner, a random
        ``limit`` of the first few times as many, so runners stop picking the same rows."""
        spread = _SPREAD if self._spread else 1
        ids = list(candidates.values_list("pk", flat=True)[: limit * spread])
        return random.sample(ids, limit) if len(ids) > limit else ids

    def _pick(self, kind: str, flow: FlowLimits, candidates: Any, limit: int) -> list[int] | None:
        """Up to ``limit`` candidate ids whose rate windows have room; None when the
        kind's own window is full."""
        if flow.rate_limit is None:
            return self._first(candidates, limit)
        rate_limit, period = flow.rate_limit
        if flow.rate_key is None:
            name = window_name(kind)
            room = len(windows.free_slots(name, "", rate_limit, period, using=self.using))
            if not room:
                wait = windows.seconds_until_free(name, "", rate_limit, period, using=self.using)
                self._retry_within(wait)
                # Until its oldest start leaves the window: no slot opens sooner but by a
                # release, whose NOTIFY wakes the kind (at most _REST where none comes).
                self._rest_for(kind, self._began, min(wait, _REST), new_rows_can_start=False)
                return None
            return self._first(candidates, min(limit, room))
        rows = (
            candidates.annotate(window_key=Coalesce(F("rate_key_hash"), Value("")))
            .annotate(busy=busy_starts_subquery(kind, flow))
            .filter(busy__lt=rate_limit)
            .values_list("pk", "window_key", "busy")[: limit * _RATE_KEY_SPREAD]
        )
        picked: list[int] = []
        taken: dict[str, int] = defaultdict(int)
        for pk, key, busy in rows:
            if busy + taken[key] < rate_limit:
                taken[key] += 1
                picked.append(pk)
                if len(picked) >= limit:
                    break
        if not rows:
            return self._rest_for_key_windows(kind, period, candidates)
        return picked

    def _rest_for_key_windows(self, kind: str, period: float, candidates: Any) -> list[int] | None:
        """No candidate's rate key has room: rest the kind until the first start in those
        keys' windows leaves (a lower bound of when one has room; at most _REST) and
        return None (no rest if they left meanwhile); [] when there is no candidate."""
        keys = (
            candidates.order_by()
            .annotate(window_key=Coalesce(F("rate_key_hash"), Value("")))
            .values("window_key")
        )
        first = (
            FlowWindowSlot.objects.using(self.using)
            .filter(
                name=window_name(kind),
                key_hash__in=keys,
                started_at__gt=DatabaseNow() - windows.held_for(period),
            )
            .annotate(db_now=DatabaseNow())
            .order_by("started_at")
            .values_list("started_at", "db_now")
            .first()
        )
        if first is None:
            # No candidate at all; or those windows freed since the candidates were read:
            # then ask again at the next turn, rather than rest as if every key were busy,
            # and at once (an idle runner's next turn is otherwise its poll interval away).
            if not candidates.exists():
                return []
            self._retry_within(0.0)
            return None
        started_at, now = first
        # A reserved start is stamped ahead (windows.RESERVED_FOR): its attempt starts in
        # a moment and is stamped then, so its window frees a period from now at the soonest.
        wait = max(0.0, (min(started_at, now) + windows.held_for(period) - now).total_seconds())
        self._retry_within(wait)
        self._rest_for(kind, self._began, min(wait, _REST))
        return None

    def _claim_and_start(
        self,
        claimer: Claimer,
        kind: str,
        flow: FlowLimits,
        candidates: Any,
        ids: list[int],
        *,
        reclaimed: bool,
        changes: dict[str, Any] | None = None,
        variants: Any = None,
    ) -> list[ClaimedWork]:
        options: dict[str, Any] = dict(changes or {})
        if variants is not None:
            options["variants"] = variants
        connection = connections[self.using]
        if flow.rate_limit is None and connection.get_autocommit() and not connection.in_atomic_block:
            # One statement: a claim a unique index refuses leaves nothing behind.
            return _limited(claimer.claim_rows(candidates, ids, reclaimed=reclaimed, **options))
        # One transaction: a claim whose starts the window cannot grant leaves nothing
        # behind (inside a caller's transaction it is a savepoint, so a refusal by a
        # unique index does not break that transaction).
        works: list[ClaimedWork] = []
        try:
            with transaction.atomic(using=self.using):
                works = claimer.claim_rows(candidates, ids, reclaimed=reclaimed, **options)
                if flow.rate_limit is not None:
                    granted = self._take_starts(kind, flow, works)
                    if granted < len(works):
                        raise _Shortfall(granted)
        except Exception as error:
            if works and not reclaimed:  # it ran: its commit's answer may be what was lost
                reserved = [work.reservation for work in works if work.reservation is not None]
                claimer.note_unanswered(works[0].claim_token, error, reserved)
            raise
        return _limited(works)

    def _take_starts(self, kind: str, flow: FlowLimits, works: list[ClaimedWork]) -> int:
        """Reserve a start of the window for each claimed row (counted when the attempt
        starts: ``flow.starts``); returns how many were reserved."""
        assert flow.rate_limit is not None
        limit, period = flow.rate_limit
        by_key: dict[str, list[ClaimedWork]] = defaultdict(list)
        if flow.rate_key is None:
            by_key[""] = list(works)
        else:
            hashes = dict(
                DeferredWork.objects.using(self.using)
                .filter(pk__in=[work.id for work in works])
                .values_list("pk", "rate_key_hash")
            )
            for work in works:
                by_key[window_key_of(hashes.get(work.id))].append(work)
        granted = 0
        for key, group in by_key.items():
            reserved = windows.reserve_starts(
                window_name(kind), key, limit, period, len(group), using=self.using
            )
            for work, reservation in zip(group, reserved, strict=False):
                work.reservation = reservation
            granted += len(reserved)
            if len(reserved) < len(group):
                break  # the transaction rolls back: no need to take the rest
        return granted

    # --- stale work ---------------------------------------------------------------------

    def claim_stale(
        self,
        claimer: Claimer,
        limit: int,
        *,
        cutoff: Any,
        variants: Any,
        works: list[ClaimedWork],
        once: bool = False,
    ) -> None:
        """Reclaim stale rows of limited kinds into ``works`` (as :meth:`claim_due` does).
        A reclaimed row keeps its slot and its key (it never stopped being processing); a
        reclaim is a start, so it needs a start of its rate window, and waits stale until
        one is free (``once``: :attr:`stale_held_back` says so, and --once waits)."""
        self._began = time.monotonic()
        self.stale_held_back = False
        before = len(works)
        self._claim_stale_kinds(claimer, limit, cutoff=cutoff, variants=variants, works=works, once=once)
        if once and len(works) > before:
            self.stale_held_back = True  # more may be left: --once checks again before it ends

    def _claim_stale_kinds(
        self,
        claimer: Claimer,
        limit: int,
        *,
        cutoff: Any,
        variants: Any,
        works: list[ClaimedWork],
        once: bool,
    ) -> None:
        for workflow in self._in_turn("stale"):
            if len(works) >= limit:
                break
            flow = workflow.flow
            assert flow is not None
            stale = DeferredWork.objects.using(self.using).filter(
                kind=workflow.kind, status=Status.PROCESSING, heartbeat_at__lt=cutoff
            )
            budget = limit - len(works)
            for _ in range(_ROUNDS):
                ids = self._pick(workflow.kind, flow, stale.order_by("heartbeat_at", "pk"), budget)
                if not ids:  # nothing stale, or no start free in the window
                    if once and not self.stale_held_back:
                        self.stale_held_back = stale.exists()
                    break
                try:
                    works.extend(
                        self._claim_and_start(
                            claimer,
                            workflow.kind,
                            flow,
                            stale,
                            ids,
                            reclaimed=True,
                            variants=variants,
                        )
                    )
                    break
                except _Shortfall as shortfall:
                    claimer.contended = True
                    budget = shortfall.granted

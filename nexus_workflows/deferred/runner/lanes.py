"""The runner's two lanes (sync attempts on threads, async ones on the event loop): which
work goes where, and claiming due work for each only as far as it has room."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.db import connections

from nexus_workflows.conf import app_settings
from nexus_workflows.deferred.claims import Claimer, ClaimInterrupted
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.runner.capacity import Capacity
from nexus_workflows.deferred.runner.ledger import ASYNC, SYNC, Ledger
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.flow.windows import Reservation


def lane_of(work: ClaimedWork) -> str:
    """The lane an attempt of ``work`` runs in: the event loop for an ``async def``
    prepare, the thread pool for the rest (sync prepares, Django tasks, unknown kinds).
    Decided at the first ask and kept on ``work``."""
    if work.lane is None:
        work.lane = _lane(work)
    return work.lane


def _lane(work: ClaimedWork) -> str:
    if work.is_task or work.kind not in registry:
        return SYNC
    return ASYNC if registry.get(work.kind).is_async else SYNC


def journal_writers(using: str) -> int:
    """Journal writer threads (one connection each): ``DB_CONNECTIONS`` less the main
    loop's, the heartbeat's and, where there is one, the wake-up listener's connection."""
    own = 2 + (1 if app_settings.WAKEUP and connections[using].vendor == "postgresql" else 0)
    return max(1, int(app_settings.DB_CONNECTIONS) - own)


class LaneClaims:
    """Claims due work per lane: each lane's kinds only as far as its own slots (plus
    prefetch) allow, so sync work never waits in this runner for a thread while async
    slots are free, nor the other way round; and the wake-up path, rows a NOTIFY named
    claimed by id. ``claimed(works)`` hands what was claimed to the runner,
    ``reclaimed(works)`` what a stale claim took.

    Kinds with flow limits are claimed only as far as the lane can start them about at
    once (:meth:`limited_room`), on every claim turn, also while the lane holds a
    prefetch of other work: their rows hold a slot, key or reserved start from the claim
    and are handed out ahead of that prefetch (``ledger.LaneQueue``).
    """

    def __init__(
        self,
        *,
        kinds: Sequence[str],
        queues: Sequence[str] | None,
        using: str,
        worker_id: str,
        ledger: Ledger,
        capacity: dict[str, Capacity],
        claimed: Callable[[list[ClaimedWork]], None],
        reclaimed: Callable[[list[ClaimedWork]], None],
        on_unanswered: Callable[[str, Sequence[Reservation]], None] | None = None,
    ) -> None:
        async_kinds = [kind for kind in kinds if registry.get(kind).is_async]
        sync_kinds = [kind for kind in kinds if kind not in async_kinds]
        self.claimers: dict[str, Claimer] = {}
        claimer = functools.partial(Claimer, using=using, worker_id=worker_id, on_unanswered=on_unanswered)
        if sync_kinds or queues != []:
            self.claimers[SYNC] = claimer(kinds=sync_kinds, queues=queues)
        if async_kinds:
            self.claimers[ASYNC] = claimer(kinds=async_kinds, queues=[])
        self.ledger = ledger
        self.capacity = capacity
        self.claimed = claimed
        self.reclaimed = reclaimed
        # Rows a NOTIFY named, (id, kind) by lane (appended by the listener's thread).
        self._notified: dict[str, deque[tuple[int, str]]] = {SYNC: deque(), ASYNC: deque()}
        # Whether any lane has kinds with flow limits (claimed on every turn).
        self.limited = any(claimer.flow is not None for claimer in self.claimers.values())
        # Whether each lane's last claim got all it asked for (kept while it has no room).
        self._backlogged = dict.fromkeys(self.claimers, False)

    def backlogged(self) -> bool:
        """Whether every lane has a backlog: this runner claims again by itself, so a
        NOTIFY would not start anything sooner."""
        return all(self._backlogged.values())

    def wants_more(self, lane: str | None = None) -> bool:
        """Whether ``lane`` (or any lane) has room for more claims."""
        lanes = self.claimers if lane is None else [lane]
        return any(self.capacity[name].wants_more(self.ledger.held_count(name)) for name in lanes)

    def limited_room(self, lane: str) -> int:
        """How many rows of limited kinds ``lane`` may claim now: as many as it can start
        about at once (free slots, and slots expected to end quick work within
        ``PREFETCH_SECONDS``: ``Ledger.limited_room``), ≤ 0 for none."""
        capacity = self.capacity[lane]
        return self.ledger.limited_room(capacity.concurrency, capacity.finishing_soon(), lane)

    def held_back(self) -> bool:
        """Whether the last claims with a cutoff (``--once``) left due or stale work that
        only full rate windows held back: it can start once they slide."""
        return any(
            claimer.flow is not None and (claimer.flow.held_back or claimer.flow.stale_held_back)
            for claimer in self.claimers.values()
        )

    def retry_in(self) -> float | None:
        """Seconds until a rate window a claim found full has a start again."""
        waits = [wait for claimer in self.claimers.values() if (wait := claimer.retry_in()) is not None]
        return min(waits) if waits else None

    def new_work(self, work_id: int, kind: str, queue: str | None = None) -> bool:
        """Listener thread: a row of ``kind`` (a Django task's: of ``queue``, None when the
        NOTIFY did not name it) was inserted alone; remember it for a claim by id if a lane
        takes it (by kind and queue; the claim re-checks everything), or end the rest of its
        kind if that has flow limits (the next claim asks it). Whether this runner takes
        rows of ``kind`` (if not, the wake-up is ignored: no claim)."""
        for lane, claimer in self.claimers.items():
            if claimer.takes_by_id(kind, queue):
                self._notified[lane].append((work_id, kind))
                return True
        return self.wake_limited(kind)

    def kind_ended(self, kind: str) -> bool:
        """Listener thread: an attempt of ``kind`` ended on some runner (a slot or key of
        it is free); end its rest. Whether this runner takes rows of ``kind``."""
        woken = self.wake_limited(kind)
        return woken or any(claimer.takes_by_id(kind) for claimer in self.claimers.values())

    def wake_limited(self, kind: str | None = None) -> bool:
        """Any thread: end the rest of limited ``kind`` (None: of every limited kind), so
        the next claim asks it (a wake-up named it or no kind; an attempt of it ended).
        Whether a kind of this runner's was woken."""
        woken = False
        for claimer in self.claimers.values():
            if claimer.flow is not None and (kind is None or kind in claimer.flow.kinds):
                claimer.flow.wake(kind)
                woken = True
        return woken

    def quiet_kinds(self) -> frozenset[str]:
        """The limited kinds that rest (found nothing and claimed nothing since)."""
        return frozenset(
            kind for claimer in self.claimers.values() if claimer.flow for kind in claimer.flow.quiet
        )

    def full_kinds(self) -> frozenset[str]:
        """The limited kinds that rest until an attempt of theirs ends (every slot held)."""
        return frozenset(
            kind for claimer in self.claimers.values() if claimer.flow for kind in claimer.flow.full
        )

    def claim_notified(self, cutoff: datetime | None) -> int:
        """Claim the rows NOTIFYs named, by id in one statement per lane, each lane only as
        far as it has free slots (the ordinary claim takes the rest); how many."""
        claimed = 0
        for lane, claimer in self.claimers.items():
            notified = self._notified[lane]
            free = self.ledger.free_slots(self.capacity[lane].concurrency, lane)
            named = [notified.popleft() for _ in range(min(free, len(notified)))]
            notified.clear()
            # A workflow's row (its kind has no dot) takes the precompiled claim; a Django
            # task's the ORM's (it re-checks the queue). --once (a cutoff) has no listener.
            workflows = [work_id for work_id, kind in named if "." not in kind and cutoff is None]
            others = [work_id for work_id, kind in named if work_id not in workflows]
            by_id = claimer.claim_workflow_ids(workflows)
            self.claimed(by_id)  # before the next claim, which may raise
            tasks = claimer.claim_due_ids(others, now=cutoff)
            self.claimed(tasks)
            claimed += len(by_id) + len(tasks)
        return claimed

    def claim_due(self, cutoff: datetime | None) -> tuple[int, bool, int]:
        """Claim due work for every lane with room, and limited work for a lane without
        (see the class's docstring): (items claimed, whether more may be waiting: a claim
        with room got all it asked for or lost rows to another runner, room left)."""
        claimed, more, room = 0, False, 0
        for lane, claimer in self.claimers.items():
            startable = self.limited_room(lane) if claimer.flow is not None else 0
            if not self.wants_more(lane):
                if startable > 0:
                    claimed += len(self._claim(claimer, startable, cutoff, startable, plain=False))
                continue
            limit = self.capacity[lane].claim_limit(self.ledger.held_count(lane))
            due = self._claim(claimer, limit, cutoff, startable) if limit > 0 else []
            full = 0 < limit <= len(due) or bool(due and claimer.contended)
            if limit > 0:
                self._backlogged[lane] = full
            more = more or full
            claimed += len(due)
            room += max(limit - len(due), 0)
        return claimed, more, room

    def _claim(
        self, claimer: Claimer, limit: int, cutoff: datetime | None, startable: int, *, plain: bool = True
    ) -> list[ClaimedWork]:
        try:
            due = claimer.claim_due(limit, now=cutoff, startable=startable, plain=plain)
        except ClaimInterrupted as interrupted:
            self.claimed(interrupted.works)  # claimed before the error: they run
            raise interrupted.error from interrupted.error.__cause__  # as it was raised
        self.claimed(due)
        return due

    def claim_stale_limited(self, stale_after: timedelta, cutoff: datetime | None) -> int:
        """Reclaim stale rows of limited kinds, each lane only as far as it can start
        them about at once (a reclaim keeps the row's slot and key and takes a start);
        hands them to ``reclaimed``; how many. Kinds without limits: the runner's stale
        claim."""
        reclaimed = 0
        for lane, claimer in self.claimers.items():
            startable = self.limited_room(lane)
            if claimer.flow is None or startable <= 0:
                continue
            try:
                stale = claimer.claim_stale(
                    startable, stale_after=stale_after, now=cutoff, startable=startable, plain=False
                )
            except ClaimInterrupted as interrupted:
                self.reclaimed(interrupted.works)  # held (heart-beaten), guarded next turn
                raise interrupted.error from interrupted.error.__cause__  # as it was raised
            self.reclaimed(stale)
            reclaimed += len(stale)
        return reclaimed

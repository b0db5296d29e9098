"""Everything a runner holds, by stage, under one lock."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Iterator
from dataclasses import dataclass

from nexus_workflows.deferred.execution import Outcome
from nexus_workflows.deferred.transitions import ClaimedWork

#: The lanes of a runner: sync attempts run on the thread pool, async ones on the loop.
SYNC = "sync"
ASYNC = "async"
LANES = (SYNC, ASYNC)


@dataclass
class Pending:
    """An outcome not written yet, and when its write may be tried again."""

    outcome: Outcome
    failures: int = 0
    retry_at: float = 0.0
    # Failed writes that were refusals of the value or the row (not a lock wait cut short,
    # a deadlock or a cancel, which pass later): these alone lead to giving the write up.
    refusals: int = 0


class LaneQueue:
    """One lane's claimed work waiting for a worker: limited work first (it holds a slot,
    a serial key or a reserved start from its claim: ``ClaimedWork.limited``), then the
    rest, each in claim order. Not thread-safe: the ledger's lock guards it."""

    def __init__(self) -> None:
        self.first: deque[ClaimedWork] = deque()
        self.rest: deque[ClaimedWork] = deque()

    def append(self, work: ClaimedWork) -> None:
        (self.first if work.limited else self.rest).append(work)

    def extend(self, works: Iterable[ClaimedWork]) -> None:
        for work in works:
            self.append(work)

    def popleft(self) -> ClaimedWork:
        return self.first.popleft() if self.first else self.rest.popleft()

    def clear(self) -> None:
        self.first.clear()
        self.rest.clear()

    def __len__(self) -> int:
        return len(self.first) + len(self.rest)

    def __bool__(self) -> bool:
        return bool(self.rest) or bool(self.first)

    def __iter__(self) -> Iterator[ClaimedWork]:
        return itertools.chain(self.first, self.rest)


class Ledger:
    """The claims one runner holds, by stage; thread-safe, no I/O.

    A claim is *queued* (claimed, not started), *running* (its attempt has started;
    *unmarked* too until the start marker is written), *unwritten* (finished, outcome not
    written yet) or *unguarded* (reclaimed, crash-loop guard not written yet). Every held
    claim is heart-beaten. Running attempts are keyed by claim, not row: a row may be
    reclaimed while an old attempt still runs.

    Queued work waits in the lane ``lane_of(work)`` says (:data:`SYNC` or :data:`ASYNC`):
    sync workers block in :meth:`take`, the event loop polls :meth:`take_now`. Limited
    work is handed out before the rest of its lane (:class:`LaneQueue`).

    Queued work starts only while its claim is known to be ours: the claim, or a later
    heartbeat that found it still held (:meth:`confirm`), is recent enough for
    ``at_risk(seconds since)`` to say no. Otherwise another runner may have reclaimed it
    (heartbeats failed for ``STALE_AFTER``) and be running it: it is *forfeited* instead
    (:meth:`take_forfeited`), never started, and goes stale for a reclaim.
    """

    def __init__(
        self,
        lane_of: Callable[[ClaimedWork], str] = lambda work: SYNC,
        *,
        at_risk: Callable[[float], bool] = lambda unconfirmed_for: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lock = threading.Lock()
        self.lane_of = lane_of
        self.at_risk = at_risk
        self.clock = clock
        self._work_available = threading.Condition(self.lock)
        self._sync_taken = threading.Condition(self.lock)  # a sync worker took queued work
        self._sync_waiting = 0  # threads waiting on it: a take notifies only them
        self._queued: dict[str, LaneQueue] = {lane: LaneQueue() for lane in LANES}
        self._running: dict[tuple[str, int], ClaimedWork] = {}
        self._running_lanes: Counter[str] = Counter()
        self._running_limited: Counter[str] = Counter()
        self._unmarked: dict[tuple[str, int], ClaimedWork] = {}
        self._unwritten: list[Pending] = []
        self._unguarded: list[ClaimedWork] = []
        # Failed guard writes by claim, those that were refusals (not a lock wait cut
        # short, a deadlock, a cancel), and when each may be tried again (self.clock).
        self._guard_failures: Counter[tuple[str, int]] = Counter()
        self._guard_refusals: Counter[tuple[str, int]] = Counter()
        self._guard_retry_at: dict[tuple[str, int], float] = {}
        # When each queued claim was last known to be ours (monotonic), and the queued
        # claims given up because that was too long ago.
        self._confirmed: dict[tuple[str, int], float] = {}
        self._forfeited: list[ClaimedWork] = []
        self._closed = False
        # A stop was asked for: queued work stays queued, for close() to release.
        self._held = False

    # --- queued and running -------------------------------------------------------------

    def dispatch(self, works: list[ClaimedWork]) -> set[str]:
        """Queue claimed work in its lanes (wakes as many sync workers as sync items);
        returns the lanes that got work."""
        lanes: set[str] = set()
        if works:
            with self._work_available:
                now = self.clock()
                for work in works:
                    lane = self.lane_of(work)
                    self._queued[lane].append(work)
                    # Ours since its claim's statement was sent: one that took long (a lock
                    # wait, a stalled commit) stamped a heartbeat that old, maybe stale.
                    self._confirmed[work.key] = now if work.sent_at is None else min(now, work.sent_at)
                    lanes.add(lane)
                if SYNC in lanes:
                    self._work_available.notify(len(self._queued[SYNC]))
        return lanes

    def take(self) -> ClaimedWork | None:
        """Block until queued sync work (now running, unmarked) or :meth:`close` (None)."""
        with self._work_available:
            queued = self._queued[SYNC]
            while True:
                while (not queued or self._held) and not self._closed:
                    self._work_available.wait()
                if not queued or self._held:
                    return None
                if self._sync_waiting:
                    self._sync_taken.notify_all()
                work = self._start_if_ours(queued.popleft(), SYNC)
                if work is not None:
                    return work

    def wait_sync_taken(self, timeout: float) -> bool:
        """Block until no sync work is queued (the workers took it), the ledger is closed,
        or ``timeout`` seconds passed; whether none is queued. The runner's loop waits
        here after a wake-up's claim: blocked, it holds no GIL, so the worker starts the
        attempt at once instead of after the loop's next Python work."""
        with self._sync_taken:
            self._sync_waiting += 1
            try:
                return self._sync_taken.wait_for(
                    lambda: not self._queued[SYNC] or self._closed or self._held, timeout
                )
            finally:
                self._sync_waiting -= 1

    def take_now(self, lane: str, limit: int) -> list[ClaimedWork]:
        """Up to ``limit`` queued items of ``lane`` (now running, unmarked); never blocks."""
        taken: list[ClaimedWork] = []
        with self.lock:
            queued = self._queued[lane]
            while queued and len(taken) < limit and not self._closed and not self._held:
                work = self._start_if_ours(queued.popleft(), lane)
                if work is not None:
                    taken.append(work)
        return taken

    def _start_if_ours(self, work: ClaimedWork, lane: str) -> ClaimedWork | None:
        """Start ``work`` (running, unmarked), or forfeit it if its claim is at risk."""
        confirmed = self._confirmed.pop(work.key, None)
        if confirmed is not None and self.at_risk(self.clock() - confirmed):
            self._forfeited.append(work)
            return None
        self._running[work.key] = work
        self._running_lanes[lane] += 1
        self._running_limited[lane] += int(work.limited)
        self._unmarked[work.key] = work
        return work

    def finished(self, work: ClaimedWork, outcome: Outcome | None = None) -> None:
        """The attempt of ``work`` ended. Its ``outcome``, when given, is unwritten from
        now on, in the same step: held and heart-beaten without a gap, however long the
        main loop takes to write it (a claim waiting for a row lock)."""
        with self.lock:
            if self._running.pop(work.key, None) is not None:
                lane = self.lane_of(work)
                self._running_lanes[lane] -= 1
                self._running_limited[lane] -= int(work.limited)
            self._unmarked.pop(work.key, None)
            if outcome is not None:
                self._unwritten.append(Pending(outcome))

    def hold(self) -> None:
        """Start nothing more that is queued, from now on: a stop was asked for (a signal's
        thread calls this at once, while the main loop may still be in a claim, a purge
        batch or an outage's back-off before it calls :meth:`close`, which releases it)."""
        with self._work_available:
            self._held = True
            self._sync_taken.notify_all()

    def close(self) -> list[ClaimedWork]:
        """Stop handing out work; returns (and forgets) what was claimed but not started.
        Reclaimed work whose crash-loop guard was not written is not among it (see
        :meth:`take_unguarded`)."""
        with self._work_available:
            unstarted = [*self._queued[SYNC], *self._queued[ASYNC]]
            for queued in self._queued.values():
                queued.clear()
            self._confirmed.clear()
            self._closed = True
            self._work_available.notify_all()
            self._sync_taken.notify_all()
        return unstarted

    def running_count(self) -> int:
        with self.lock:
            return len(self._running)

    def free_slots(self, slots: int, lane: str = SYNC) -> int:
        """Of ``slots`` of ``lane``, how many have nothing to run nor queued for them."""
        with self.lock:
            return slots - len(self._queued[lane]) - self._running_lanes[lane]

    def limited_room(self, slots: int, freeing: int, lane: str = SYNC) -> int:
        """How many limited items ``lane`` can start about at once: its free slots, plus
        up to ``freeing`` of the slots given to other work (those expected to finish it
        within moments), since limited items are handed out first; less the limited
        items already queued. Slots running limited work never count."""
        with self.lock:
            queued = self._queued[lane]
            limited = len(queued.first) + self._running_limited[lane]
            # Slots other work has (running, or queued for); at most what limited work left.
            plain = len(queued.rest) + self._running_lanes[lane] - self._running_limited[lane]
            others = max(min(slots - limited, plain), 0)
            return slots - limited - others + min(max(freeing, 0), others)

    # --- claims at risk -----------------------------------------------------------------

    def confirm(self, at: float, refreshed: Container[int] | None = None) -> None:
        """A heartbeat that began at ``at`` (monotonic) refreshed the held claims of the ids
        ``refreshed`` (None: every one): queued claims among them not yet at risk then are
        ours until ``at`` at least. Those at risk stay so (another runner may have taken
        them before it) and are forfeited now, as are those the beat did not refresh (a
        row another session holds a lock on) once their last confirmation is at risk."""
        with self.lock:
            for queued in self._queued.values():
                keep: list[ClaimedWork] = []
                for work in queued:
                    confirmed = self._confirmed.get(work.key, at)
                    if self.at_risk(at - confirmed):
                        self._confirmed.pop(work.key, None)
                        self._forfeited.append(work)
                    else:
                        if refreshed is None or work.id in refreshed:
                            self._confirmed[work.key] = max(confirmed, at)
                        keep.append(work)
                queued.clear()  # in place: a blocked take() holds this queue
                queued.extend(keep)

    def take_forfeited(self) -> list[ClaimedWork]:
        """The queued claims given up since the last call (see the class's docstring)."""
        with self.lock:
            works, self._forfeited = self._forfeited, []
        return works

    # --- start markers ------------------------------------------------------------------

    def unmarked(self) -> list[ClaimedWork]:
        with self.lock:
            return list(self._unmarked.values())

    def marked(self, works: list[ClaimedWork]) -> None:
        with self.lock:
            for work in works:
                self._unmarked.pop(work.key, None)

    # --- outcomes -----------------------------------------------------------------------

    def add_unwritten(self, pending: Pending) -> None:
        with self.lock:
            self._unwritten.append(pending)

    def due_unwritten(self, now: float) -> list[Pending]:
        with self.lock:
            return [pending for pending in self._unwritten if pending.retry_at <= now]

    def written(self, batch: list[Pending]) -> None:
        done = {id(pending) for pending in batch}
        with self.lock:
            self._unwritten = [pending for pending in self._unwritten if id(pending) not in done]

    def unwritten_count(self) -> int:
        with self.lock:
            return len(self._unwritten)

    def next_retry(self) -> float | None:
        """When the earliest outcome or guard whose write failed may be tried again."""
        with self.lock:
            retries = [pending.retry_at for pending in self._unwritten if pending.failures]
            retries += self._guard_retry_at.values()
        return min(retries) if retries else None

    # --- reclaimed ----------------------------------------------------------------------

    def add_unguarded(self, works: list[ClaimedWork]) -> None:
        with self.lock:
            self._unguarded.extend(works)

    def take_unguarded(self, now: float | None = None) -> list[ClaimedWork]:
        """The reclaimed work whose guard is to be written: all of it, or with ``now``
        only what is due (a failed guard write waits until its retry time)."""
        with self.lock:
            works = self._unguarded
            if now is None:
                self._unguarded = []
                return works
            self._unguarded = [work for work in works if self._guard_waits(work, now)]
            return [work for work in works if not self._guard_waits(work, now)]

    def _guard_waits(self, work: ClaimedWork, now: float) -> bool:
        return self._guard_retry_at.get(work.key, now) > now

    def has_unguarded(self, now: float) -> bool:
        """Whether reclaimed work's guard is due to be written at ``now``."""
        with self.lock:
            return any(not self._guard_waits(work, now) for work in self._unguarded)

    def guard_failed(self, work: ClaimedWork, delay: Callable[[int], float], *, refused: bool) -> int:
        """A guard write of ``work`` failed (with ``refused``, a refusal of the value or
        the row): tried again ``delay(failures)`` seconds from now. Returns the refusals."""
        with self.lock:
            self._guard_failures[work.key] += 1
            self._guard_refusals[work.key] += int(refused)
            self._guard_retry_at[work.key] = self.clock() + delay(self._guard_failures[work.key])
            return self._guard_refusals[work.key]

    def guard_settled(self, work: ClaimedWork) -> None:
        """The guard of ``work`` was written, or given up: forget its failures."""
        with self.lock:
            for failed in (self._guard_failures, self._guard_refusals, self._guard_retry_at):
                failed.pop(work.key, None)

    # --- everything ---------------------------------------------------------------------

    def held(self) -> list[ClaimedWork]:
        """Every claim to heart-beat."""
        with self.lock:
            return [
                *self._queued[SYNC],
                *self._queued[ASYNC],
                *self._running.values(),
                *(pending.outcome.work for pending in self._unwritten),
                *self._unguarded,
            ]

    def held_count(self, lane: str | None = None) -> int:
        """Claims held (of ``lane`` only, when given)."""
        with self.lock:
            if lane is None:
                queued = sum(len(queued) for queued in self._queued.values())
                return queued + len(self._running) + len(self._unwritten) + len(self._unguarded)
            finished = [pending.outcome.work for pending in self._unwritten]
            others = sum(1 for work in (*finished, *self._unguarded) if self.lane_of(work) == lane)
            return len(self._queued[lane]) + self._running_lanes[lane] + others

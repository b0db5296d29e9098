"""Sliding windows of starts, decided by the database: ``rate_limit`` and ``rate_limited``.

A window of ``limit`` starts per ``period`` seconds is a ring of ``limit`` rows of
:class:`~nexus_workflows.models.FlowWindowSlot` per (name, key hash). A start takes one
row whose last start is at least ``period`` old, by compare-and-set on the database's
clock::

    UPDATE … SET started_at = now() WHERE name = … AND slot IN (…)
        AND started_at <= now() - (period + MARGIN)

Two starts on one row are therefore at least ``period`` apart (``period + MARGIN``: see
``MARGIN``), and by the pigeonhole principle no ``period``-long window ever holds more
than ``limit`` starts, however many processes take slots at once. No row is ever
deleted while it could still count, and rows are made once per (name, key hash), so the
table stays small and nothing needs a lock or a clock but the database's.

A workflow's ``rate_limit`` counts the moment an attempt *starts*, which comes a little
after its claim (the hand-off to a worker thread). So the claim only *reserves* a row
(:func:`reserve_starts`: its ``started_at`` is set ``RESERVED_FOR`` seconds into the
future, so nobody else can take it), and the attempt's start stamps it with the
database's now, the very value written to the work's ``started_at``
(:func:`start_reserved`). A reservation is only ever made on a row that was free, so
its row's last start is at least ``period`` older than the reservation, and older still
than the start that replaces it: the ring's rule holds for the starts themselves.

A limit changed by a deploy leaves the ring's rows as they are: a lowered limit's rows
above it keep their starts, which :func:`free_slots` folds below the limit before it
offers a start (see :func:`_fold`), so the starts of the current period count against
the new limit; a raised limit adds free rows. A lengthened period: each row keeps only
its latest start, and the shorter period let earlier ones onto it, at least that period
(and ``MARGIN``) apart; so a row stamped at ``s`` under period ``p`` may hide starts until
``s - p``, which the new period ``P`` counts until ``s - p + P``. Each row says the period
of its stamp, and the window offers no start until ``s + P - p`` has passed for every row
(:func:`_lengthened_wait`): never more than ``limit`` starts in any new period, at the
price of a pause of at most ``P - p`` after the last start under ``p``. No start is ever
stamped under a shorter period again (one window name, one period at a time), so a
window read as clear stays clear, and no compare-and-set needs to check it.
"""

# Long module: one ring's every write (starts, reservations, the fold of a changed limit) and rate_limited.

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from asgiref.sync import sync_to_async
from django.db import DatabaseError, router, transaction
from django.db.models import DateTimeField, DurationField, ExpressionWrapper, Q, Value

from nexus_workflows.clock import DatabaseNow
from nexus_workflows.exceptions import InvalidRateLimit, RateLimitTimeout
from nexus_workflows.flow.committed import close_if_broken, run_committed
from nexus_workflows.flow.options import is_rate_limit, is_rate_period
from nexus_workflows.json_values import text_problem
from nexus_workflows.limits import RATE_LIMIT_MAX, RATE_PERIOD_MAX

logger = logging.getLogger(__name__)

NAME_MAX_LENGTH = 200
# The oldest possible last start: a slot row made with it is free at once.
_NEVER = "1970-01-01T00:00:00+00:00"

# How long a waiter sleeps at most between looks, whatever the window says: another
# process may have been given a slot back by a rollback.
_MAX_NAP = 1.0

# Seconds a start keeps its row beyond the period. The database stamps a start, and the
# code it starts (prepare, or the block of rate_limited) runs a moment later on its host:
# a few milliseconds on a quiet machine, more when it is loaded. Without a margin, the
# stamps that code takes itself could show limit + 1 starts in one period by that much
# (measured: 2.5-4 ms short of the period with three runners on a quiet machine). It
# costs limit / (period + MARGIN) at most: 19.5 starts/s of 20.
MARGIN = 0.025

# Seconds a claim's reservation of a start stays taken without its attempt starting: far
# longer than any hand-off from a claim to a worker thread. A reservation whose runner
# died before the start is free again ``RESERVED_FOR + period`` after the claim; one
# given back (a shutdown's release, an outage) is free at once.
RESERVED_FOR = 30.0
# A start re-stamps its reservation only if the reservation is this young: a row's
# stamp later than ``now + RESERVED_FOR / 2`` can only be a reservation (starts are
# stamped with the database's now), which two racing starts can never both re-stamp.
_FRESH_RESERVATION = RESERVED_FOR / 2


@dataclass(frozen=True)
class Reservation:
    """A start of a window that a claim reserved for one attempt."""

    name: str
    key_hash: str
    slot: int
    limit: int
    period: float


def _now_plus(seconds: float) -> Any:
    later = DatabaseNow() + Value(timedelta(seconds=seconds), output_field=DurationField())
    return ExpressionWrapper(later, output_field=DateTimeField())


def _slots(name: str, key_hash: str, using: str) -> Any:
    from nexus_workflows.models import FlowWindowSlot

    return FlowWindowSlot.objects.using(using).filter(name=name, key_hash=key_hash)


def held_for(period: float) -> timedelta:
    """How long a start keeps its row: the period and ``MARGIN``."""
    return timedelta(seconds=period + MARGIN)


def _free_q(period: float) -> Q:
    return Q(started_at__lte=DatabaseNow() - held_for(period))


def _ensure_ring(name: str, key_hash: str, limit: int, present: set[int], using: str) -> None:
    """Make the slot rows this window lacks (the first use of a name or key, or a larger
    limit), free from the start. Concurrent makers are harmless: the rows are unique."""
    from datetime import datetime

    from nexus_workflows.models import FlowWindowSlot

    missing = [slot for slot in range(limit) if slot not in present]
    if not missing:
        return
    never = datetime.fromisoformat(_NEVER)
    FlowWindowSlot.objects.using(using).bulk_create(
        [FlowWindowSlot(name=name, key_hash=key_hash, slot=slot, started_at=never) for slot in missing],
        ignore_conflicts=True,
    )


def free_slots(name: str, key_hash: str, limit: int, period: float, *, using: str) -> list[int]:
    """The slot numbers of the window that a start could take now (database clock).

    Rows at or above ``limit`` are a larger ring's (the limit was lowered since): their
    starts still count. Before anything is offered, the ring's busiest rows are moved
    below ``limit`` (:func:`_fold`), so the ``limit`` rows a start may take hold the
    ``limit`` latest starts of the whole ring, and a lowered (or raised again) limit
    counts every start of the current period from the moment it is deployed."""
    for _ in range(6):  # the ring made, a fold, and other processes folding meanwhile
        rows = list(
            _slots(name, key_hash, using)
            .annotate(db_now=DatabaseNow())
            .values_list("slot", "started_at", "db_now", "period")
        )
        present = {slot for slot, _, _, _ in rows}
        if any(slot not in present for slot in range(limit)):
            _ensure_ring(name, key_hash, limit, present, using)
            continue
        if _fold(name, key_hash, limit, period, rows, using=using):
            continue
        if _lengthened_wait(rows, period) > 0:
            return []
        held = held_for(period)
        return [slot for slot, started_at, now, _ in rows if slot < limit and started_at <= now - held]
    raise DatabaseError(f"rate window {name!r}: its rows kept changing while they were folded; try again")


class _Raced(Exception):
    """A row moved by :func:`_fold` changed meanwhile: roll the fold back and read again."""


_Row = tuple[int, datetime, datetime, float | None]  # slot, started_at, the database's now, period


def _lengthened_wait(rows: list[_Row], period: float) -> float:
    """Seconds until no start a shorter period allowed before a row's latest can be in
    a window of ``period`` (see the module docstring); ≤ 0 when none can. Rows without
    a period (stamped before it was kept) are taken as stamped under ``period``."""
    waits = [
        (stamp - now).total_seconds() + period - own
        for _, stamp, now, own in rows
        if own is not None and own < period
    ]
    return max(waits, default=0.0)


def _fold(name: str, key_hash: str, limit: int, period: float, rows: list[_Row], *, using: str) -> bool:
    """Swap the stamps of rows at or above ``limit`` that still count with older stamps
    of rows below it, until the rows below ``limit`` hold the ring's latest starts;
    returns whether anything was swapped (the caller reads the ring again).

    Swapping keeps every stamp (a limit raised again later counts them all), and a start
    only ever replaces a free row's stamp with a later one, so the rows below ``limit``
    keep the ring's latest ``limit`` stamps from then on: "a row below ``limit`` is
    free" then means "fewer than ``limit`` starts in the last ``period``", whatever the
    ring's size was before. Reserved rows (stamped in the future) are never moved out:
    their claims re-stamp them by slot. Each swap is a compare-and-set of both rows, in
    one transaction: a row another process changed meanwhile rolls the fold back."""
    if not rows:
        return False
    now = rows[0][2]
    periods = {slot: own for slot, _, _, own in rows}
    counting = sorted(
        ((stamp, slot) for slot, stamp, _, _ in rows if slot >= limit and stamp > now - held_for(period)),
        reverse=True,
    )
    if not counting:
        return False
    below = sorted((stamp, slot) for slot, stamp, _, _ in rows if slot < limit and stamp <= now)
    swaps = [(high, low) for high, low in zip(counting, below, strict=False) if high[0] > low[0]]
    if not swaps:
        return False
    try:
        with transaction.atomic(using=using):
            for (high_stamp, high_slot), (low_stamp, low_slot) in swaps:
                # Each stamp keeps its period (_lengthened_wait).
                moved = (
                    _slots(name, key_hash, using)
                    .filter(slot=low_slot, started_at=low_stamp)
                    .update(started_at=high_stamp, period=periods[high_slot])
                )
                moved += (
                    _slots(name, key_hash, using)
                    .filter(slot=high_slot, started_at=high_stamp)
                    .update(started_at=low_stamp, period=periods[low_slot])
                )
                if moved != 2:
                    raise _Raced
    except _Raced:
        pass
    return True


def take_starts(name: str, key_hash: str, limit: int, period: float, wanted: int, *, using: str) -> int:
    """Take up to ``wanted`` starts of the window now; returns how many were taken.

    Inside the caller's transaction the taken slots count only if it commits: the claim
    takes its starts in the same transaction as its rows, so a rolled-back claim started
    nothing and counted nothing.
    """
    if wanted <= 0:
        return 0
    taken = 0
    for _ in range(3):  # a slot we picked may be taken by another process meanwhile
        free = free_slots(name, key_hash, limit, period, using=using)
        if not free:
            break
        picked = random.sample(free, min(wanted - taken, len(free)))
        taken += (
            _slots(name, key_hash, using)
            .filter(_free_q(period), slot__in=picked)
            .update(started_at=DatabaseNow(), period=period)
        )
        if taken >= wanted:
            break
    return taken


def reserve_starts(
    name: str, key_hash: str, limit: int, period: float, wanted: int, *, using: str
) -> list[Reservation]:
    """Reserve up to ``wanted`` starts of the window for attempts about to start (see the
    module docstring); returns the reservations made. Inside the caller's transaction,
    like :func:`take_starts`: a rolled-back claim reserved nothing."""
    reserved: list[Reservation] = []
    for _ in range(3):  # a slot we picked may be taken by another process meanwhile
        free = free_slots(name, key_hash, limit, period, using=using)
        if not free:
            break
        for slot in random.sample(free, min(wanted - len(reserved), len(free))):
            taken = (
                _slots(name, key_hash, using)
                .filter(_free_q(period), slot=slot)
                .update(started_at=_now_plus(RESERVED_FOR), period=period)
            )
            if taken:
                reserved.append(Reservation(name, key_hash, slot, limit, period))
        if len(reserved) >= wanted:
            break
    return reserved


def start_reserved(reservation: Reservation, *, using: str) -> tuple[int, datetime] | None:
    """Turn ``reservation`` into a start now (database clock) and return (its row, its
    stamp); None when no start of the window is free. Call it inside a transaction, and write the
    returned stamp as the attempt's start before committing.

    The reservation's own row is re-stamped while it is still reserved; if it is not
    (it outlived ``RESERVED_FOR``, or a racing start took it), any free row is taken,
    under the ring's usual rule.
    """
    mine = _slots(reservation.name, reservation.key_hash, using).filter(slot=reservation.slot)
    if mine.filter(started_at__gt=_now_plus(_FRESH_RESERVATION)).update(started_at=DatabaseNow()):
        return reservation.slot, mine.values_list("started_at", flat=True).get()
    name, key, limit, period = reservation.name, reservation.key_hash, reservation.limit, reservation.period
    for _ in range(3):
        free = free_slots(name, key, limit, period, using=using)
        if not free:
            return None
        slot = random.choice(free)
        row = _slots(name, key, using).filter(slot=slot)
        if row.filter(_free_q(period)).update(started_at=DatabaseNow(), period=period):
            return slot, row.values_list("started_at", flat=True).get()
    return None


def confirm_start(reservation: Reservation, slot: int, stamp: datetime, *, using: str) -> int:
    """Move a start's row from ``stamp`` to now: the code it started is known to be
    running by now, so the row counts that start from no earlier than it really began
    on its host. Only while the row still holds this start (a compare-and-set on
    ``stamp``); a later stamp only keeps the row longer, so the ring's rule holds."""
    return (
        _slots(reservation.name, reservation.key_hash, using)
        .filter(slot=slot, started_at=stamp)
        .update(started_at=DatabaseNow())
    )


def give_back(reservation: Reservation, *, using: str) -> int:
    """Free a reservation whose attempt will not start (a released claim): its row is
    stamped ``period`` (and ``MARGIN``) ago, which is no later than its last real start could be (the row
    was free when it was reserved), so the ring's rule still holds."""
    return (
        _slots(reservation.name, reservation.key_hash, using)
        .filter(slot=reservation.slot, started_at__gt=_now_plus(_FRESH_RESERVATION))
        .update(started_at=_now_plus(-(reservation.period + MARGIN)))
    )


def busy_count(name: str, key_hash: str, limit: int, period: float, *, using: str) -> int:
    """Starts of the window within the last ``period`` (database clock), those of rows
    above ``limit`` too (a lowered limit's): it may exceed ``limit``."""
    return _slots(name, key_hash, using).exclude(_free_q(period)).count()


def seconds_until_free(name: str, key_hash: str, limit: int, period: float, *, using: str) -> float:
    """Seconds (database clock) until the window's oldest start leaves it, or a
    lengthened period's pause ends if that is later (:func:`_lengthened_wait`); 0 when a
    slot is free now."""
    # One read of the ring: the rows stamped under a shorter period and the oldest start
    # below the limit both come from it (a ring is a few rows: its largest limit's).
    rows: list[_Row] = list(
        _slots(name, key_hash, using)
        .annotate(db_now=DatabaseNow())
        .values_list("slot", "started_at", "db_now", "period")
    )
    pause = max(0.0, _lengthened_wait(rows, period))
    below = [(started_at, now) for slot, started_at, now, _ in rows if slot < limit]
    if not below:
        return pause
    started_at, now = min(below)
    return max(pause, (started_at + held_for(period) - now).total_seconds())


def prune(*, using: str, older_than: float = 3600.0, periods: Mapping[str, float] | None = None) -> int:
    """Delete slot rows whose last start is over ``older_than`` seconds old and can no
    longer count. A missing row is as free as an old one (the ring remakes it), so this
    only bounds the table for keys that come and go (per-sender or per-base windows).

    The rows do not say their window's period, and a row still counts for a whole period
    (up to a year): deleting a day-long window's row after an hour would grant a second
    start that day. So a window named in ``periods`` (name -> period in seconds: the
    workflows' own windows) keeps its rows for its period, and every other window (those
    of ``rate_limited``, whose periods only their callers know) for the longest period a
    window may have."""
    from nexus_workflows.models import FlowWindowSlot

    def unused_for(seconds: float) -> Q:
        return Q(started_at__lt=DatabaseNow() - timedelta(seconds=max(older_than, seconds)))

    known = dict(periods or {})
    expired = ~Q(name__in=list(known)) & unused_for(RATE_PERIOD_MAX.total_seconds() + MARGIN)
    for name, period in known.items():
        expired |= Q(name=name) & unused_for(period + MARGIN)
    deleted, _ = FlowWindowSlot.objects.using(using).filter(expired).delete()
    return deleted


# --- rate_limited ---------------------------------------------------------------------


_A_YEAR = f"{RATE_PERIOD_MAX.total_seconds():,.0f}"


def _check(
    name: object, limit: object, period: object, timeout: object
) -> tuple[str, int, float, float | None]:
    # Bad values are named by type only: arguments given in the wrong order can put a
    # name or a phone number where a number belongs.
    if not isinstance(name, str) or not name or len(name) > NAME_MAX_LENGTH or text_problem(name):
        raise InvalidRateLimit(
            f"rate_limited: name must be a non-empty string of at most {NAME_MAX_LENGTH} "
            "characters of valid Unicode without NUL (it is stored and shown in status output: "
            f"no patient data); got {type(name).__name__}"
        )
    if not is_rate_limit(limit):
        raise InvalidRateLimit(
            f"rate_limited({name!r}): limit must be a whole number of starts from 1 to "
            f"{RATE_LIMIT_MAX:,}; got {type(limit).__name__}"
        )
    if not is_rate_period(period):
        raise InvalidRateLimit(
            f"rate_limited({name!r}): period must be a number of seconds greater than 0 and at "
            f"most {_A_YEAR} (a year); got {type(period).__name__}"
        )
    no_wait = isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout == 0
    if timeout is not None and not no_wait and not is_rate_period(timeout):
        raise InvalidRateLimit(
            f"rate_limited({name!r}): timeout must be None (wait as long as it takes) or a "
            f"number of seconds from 0 to {_A_YEAR} (a year); got {type(timeout).__name__}"
        )
    # timeout is None, 0 or a period here.
    return name, limit, float(period), None if timeout is None else float(cast(float, timeout))


class rate_limited:
    """Wait until a start of the window ``name`` (at most ``limit`` starts in any
    ``period`` seconds, across every process of the database) is free, and take it.

    ``with rate_limited("sms-sender:main", 10, 1): send(...)`` — or ``async with``. The
    name is stored in clear and shown in status output: make it opaque, never a phone
    number or other patient data. After
    ``timeout`` seconds without a slot it raises :class:`RateLimitTimeout`, a transient
    error. The slot counts a *start*: leaving the block gives nothing back. Inside a
    transaction the start is committed at once, on a connection of its own, whether or
    not the transaction commits (on SQLite it stays in the transaction: see
    ``flow.committed``).
    """

    def __init__(
        self, name: str, limit: int, period: float, timeout: float | None = None, *, using: str | None = None
    ) -> None:
        self.name, self.limit, self.period, self.timeout = _check(name, limit, period, timeout)
        self._using = using
        self.waited = 0.0

    @property
    def using(self) -> str:
        from nexus_workflows.models import FlowWindowSlot

        return self._using or router.db_for_write(FlowWindowSlot)

    def _try(self) -> float | None:
        """Take a start; returns None when taken, else the seconds to wait before trying
        again."""
        using = self.using

        def start() -> int:
            return take_starts(self.name, "", self.limit, self.period, 1, using=using)

        try:
            # Committed at once, even inside the caller's transaction (flow.committed): the
            # call it counts is made whether or not that transaction commits.
            if run_committed(using, start):
                return None
            wait = seconds_until_free(self.name, "", self.limit, self.period, using=using)
        except DatabaseError:
            close_if_broken(using)
            raise
        # A little jitter keeps waiters of one window from all waking at the same instant.
        return min(max(wait, 0.001) + random.uniform(0, 0.01), _MAX_NAP)

    def _nap(self, started: float, wait: float) -> float:
        elapsed = time.monotonic() - started
        if self.timeout is not None and elapsed + wait > self.timeout:
            if elapsed >= self.timeout:
                raise RateLimitTimeout(
                    f"rate_limited({self.name!r}): no slot of {self.limit} per {self.period:g}s "
                    f"within {self.timeout:g}s"
                )
            return self.timeout - elapsed
        return wait

    def __enter__(self) -> rate_limited:
        started = time.monotonic()
        while (wait := self._try()) is not None:
            time.sleep(self._nap(started, wait))
        self.waited = time.monotonic() - started
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None

    async def __aenter__(self) -> rate_limited:
        started = time.monotonic()
        while (wait := await sync_to_async(self._try)()) is not None:
            await asyncio.sleep(self._nap(started, wait))
        self.waited = time.monotonic() - started
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        return None

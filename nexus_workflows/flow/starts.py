"""The start of an attempt of a rate-limited kind: the moment the rate limit counts.

The claim reserved a start of the kind's window (``windows.reserve_starts``); right
before ``prepare`` runs, :func:`begin` turns that reservation into the start, on the
database's clock, and writes the same instant as the work's ``started_at``. So "at most
``limit`` attempts start in any ``period``" holds for the attempts' ``started_at`` stamps
themselves, however long the hand-off from the claim to a worker thread took.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections, transaction

from nexus_workflows.database_errors import is_database_unavailable, rerun_if_ended_idle
from nexus_workflows.exceptions import ClaimLost, RateLimitTimeout
from nexus_workflows.flow import windows

if TYPE_CHECKING:
    from nexus_workflows.deferred.transitions import ClaimedWork

# Seconds after a rate-limited attempt was handed to its worker thread that its runner
# confirms the start (the start marker): long enough for the start itself (a few
# statements) to be written first, short enough that the row is not held much longer
# than the period (limit / (period + 0.05 + MARGIN) starts per second at most).
CONFIRM_AFTER = 0.05


class ReservedStartLapsed(RateLimitTimeout):
    """The claim's reserved start lapsed before the attempt started, and no start of the
    window is free: the attempt never started, so it is released, not failed."""


def begin(work: ClaimedWork) -> None:
    """Start ``work``'s attempt in its rate window; nothing to do for work that reserved
    no start. Raises :class:`ClaimLost` if the claim no longer holds the work,
    :class:`ReservedStartLapsed` in the rare case that the reservation outlived
    ``windows.RESERVED_FOR`` and no start of the window is free, and the database's own
    errors when it is unreachable; in every case nothing was written."""
    reservation = work.reservation
    if reservation is None:
        return
    try:
        with transaction.atomic(using=work.using):
            started = windows.start_reserved(reservation, using=work.using)
            if started is None:
                raise ReservedStartLapsed(
                    f"{work.kind} #{work.id}: its reserved start of {reservation.limit} per "
                    f"{reservation.period:g}s lapsed before the attempt started, and no start is free"
                )
            slot, stamp = started
            if work.fenced().update(started_at=stamp) != 1:
                raise ClaimLost(f"{work.kind} #{work.id}: this attempt no longer holds the work; not started")
    except ClaimLost:
        # The start was undone with the transaction; the reservation would hold its row
        # for RESERVED_FOR, a start of the window no one takes.
        give_back([work])
        raise
    work.reservation = None
    work.window_start = (reservation, slot, stamp)


def confirm(works: Iterable[ClaimedWork]) -> None:
    """Once an attempt is known to be running (its start marker, written a moment after
    ``prepare`` began; or ``prepare`` returned), move its window row's stamp to now.

    The database stamped the start just before ``prepare`` ran; the host reaches
    ``prepare``'s first line a moment later (longer when the process is descheduled).
    Counting the row from a moment known to be after that line means the next start on
    the row comes a full period after the attempt really began, so the stamps attempts
    take themselves never show ``limit + 1`` in a period. Best effort: a confirmation
    that fails leaves the database's own stamp, under which the rule holds on the
    database's clock."""
    for work in works:
        window_start = work.window_start
        if window_start is None:
            continue
        work.window_start = None
        reservation, slot, stamp = window_start
        _best_effort(
            work.using, functools.partial(windows.confirm_start, reservation, slot, stamp, using=work.using)
        )


def mark_delay(works: Iterable[ClaimedWork], default: float) -> float:
    """How long the runner's start marker may wait for company: not long when a
    rate-limited attempt waits for it, whose window row stays held until it is
    confirmed (``confirm``)."""
    if any(work.reservation is not None or work.window_start is not None for work in works):
        return min(default, CONFIRM_AFTER)
    return default


def give_back(works: Iterable[ClaimedWork]) -> None:
    """Free the reserved starts of attempts that will not start (released claims). Best
    effort: a reservation that cannot be given back is free ``RESERVED_FOR`` later."""
    for work in works:
        if work.reservation is not None:
            give_back_reserved([work.reservation], using=work.using)
            work.reservation = None


def give_back_reserved(reservations: Iterable[windows.Reservation], *, using: str) -> None:
    """Free reserved starts no attempt will take (:func:`give_back`; a claim whose answer
    was lost, whose rows were given back). Best effort, as there."""
    for reservation in reservations:
        _best_effort(using, functools.partial(windows.give_back, reservation, using=using))


def _best_effort(using: str, statement: Callable[[], object]) -> None:
    """A window statement whose failure does no harm (see :func:`confirm`, :func:`give_back`).
    On a session the server ended while idle it runs again on a new one. After another
    error that says the session is gone, the session is closed (outside a transaction),
    so that the caller's next statement (a release's, an outcome's) opens a new one
    instead of failing on this one as an outage."""
    try:
        rerun_if_ended_idle(using, statement)
    except DatabaseError as error:
        if is_database_unavailable(error) and not connections[using].in_atomic_block:
            with contextlib.suppress(Exception):  # closing a broken connection may fail too
                connections[using].close()

"""The start of an attempt of a rate-limited kind: the moment the rate limit counts.

The claim reserved a start of the kind's window (``windows.reserve_starts``); right
before ``prepare`` runs, :func:`begin` turns that reservation into the start, on the
database's clock, and writes the same instant as the work's ``started_at``. So "at most
``limit`` attempts start in any ``period``" holds for the attempts' ``started_at`` stamps
themselves, however long the hand-off from the claim to a worker thread took.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

from django.db import DatabaseError, transaction

from ..exceptions import ClaimLost, RateLimitTimeout
from . import windows

if TYPE_CHECKING:
    from ..claims import ClaimedWork


def begin(work: ClaimedWork) -> None:
    """Start ``work``'s attempt in its rate window; nothing to do for work that reserved
    no start. Raises :class:`ClaimLost` if the claim no longer holds the work,
    :class:`RateLimitTimeout` (transient) in the rare case that the reservation outlived
    ``windows.RESERVED_FOR`` and no start of the window is free, and the database's own
    errors when it is unreachable; in every case nothing was written."""
    reservation = work.reservation
    if reservation is None:
        return
    with transaction.atomic(using=work.using):
        stamp = windows.start_reserved(reservation, using=work.using)
        if stamp is None:
            raise RateLimitTimeout(
                f"{work.kind} #{work.id}: its reserved start of {reservation.limit} per "
                f"{reservation.period:g}s lapsed before the attempt started, and no start is free"
            )
        if work.fenced().update(started_at=stamp) != 1:
            raise ClaimLost(f"{work.kind} #{work.id}: this attempt no longer holds the work; not started")
    work.reservation = None


def give_back(works: Iterable[ClaimedWork]) -> None:
    """Free the reserved starts of attempts that will not start (released claims). Best
    effort: a reservation that cannot be given back is free ``RESERVED_FOR`` later."""
    for work in works:
        reservation = work.reservation
        if reservation is None:
            continue
        with contextlib.suppress(DatabaseError):
            windows.give_back(reservation, using=work.using)
        work.reservation = None

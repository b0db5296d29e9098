"""What counts as a number of a setting or an option: finite, not a bool, and an int of any
size. Python's ints are exact at any size, so one is never turned into a float to be
checked: ``math.isfinite(10**400)`` raises ``OverflowError``, which escaped registration and
the system checks themselves."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import TypeGuard

from nexus_workflows.limits import MAX_DELAY

#: Longest number of seconds any setting takes: ten years (``limits.MAX_DELAY``). Far beyond
#: any useful value, and well inside what timedelta, the databases' intervals, thread waits
#: (``threading.TIMEOUT_MAX``, about 292 years) and Redis EXPIRE (RETENTION is the TTL of
#: finished fire-and-forget jobs) hold: larger values failed at run time with OverflowError.
MAX_SECONDS = MAX_DELAY.total_seconds()


def is_finite(value: int | float | Decimal) -> bool:
    """Whether a number is finite: an int always is (never converted to a float); a
    Decimal asked itself (``math.isfinite`` raises ``ValueError`` for a signalling NaN)."""
    if isinstance(value, int):
        return True
    if isinstance(value, Decimal):
        return value.is_finite()
    return math.isfinite(value)


def is_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float, not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and is_finite(value)


def is_seconds(value: object, *, zero_allowed: bool = False) -> bool:
    """A number of seconds greater than 0 (or 0 or more) and at most MAX_SECONDS."""
    return is_number(value) and (value >= 0 if zero_allowed else value > 0) and value <= MAX_SECONDS

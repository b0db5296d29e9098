"""The ``delay`` option of ``enqueue``, checked once for deferred and fire-and-forget work
alike (its own module: both import it, and neither imports the other for it)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from nexus_workflows.exceptions import InvalidEnqueueOption
from nexus_workflows.limits import MAX_DELAY

__all__ = ["parse_delay"]


def parse_delay(kind: str, value: Any) -> timedelta:
    """``delay`` as a timedelta: seconds (int or float) or a timedelta, 0 to MAX_DELAY."""
    allowed = f"allowed: 0 to {MAX_DELAY.days} days ({MAX_DELAY.days // 365} years)"
    if isinstance(value, timedelta):
        negative, too_long = value < timedelta(0), value > MAX_DELAY
    elif type(value) is int or (type(value) is float and math.isfinite(value)):
        # Compared before any conversion: timedelta(seconds=1e20) would overflow.
        negative, too_long = value < 0, value > MAX_DELAY.total_seconds()
    else:
        raise InvalidEnqueueOption(
            f"workflow {kind!r}: delay must be a finite number of seconds or a timedelta; "
            f"got {type(value).__name__}"
        )
    if negative:
        raise InvalidEnqueueOption(f"workflow {kind!r}: delay must not be negative; {allowed}")
    if too_long:
        raise InvalidEnqueueOption(f"workflow {kind!r}: delay is too long; {allowed}")
    return value if isinstance(value, timedelta) else timedelta(seconds=value)

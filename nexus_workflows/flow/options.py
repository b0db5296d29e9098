"""The flow-control options of a deferred workflow and their registration rules."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from asgiref.sync import iscoroutinefunction

from nexus_workflows.exceptions import RegistrationError
from nexus_workflows.limits import FLOW_CONCURRENCY_MAX, RATE_LIMIT_MAX, RATE_PERIOD_MAX
from nexus_workflows.numbers import is_finite

KeyFunction = Callable[[Any], "str | None"]

#: The options ``register`` and ``@workflow`` take for flow control.
OPTION_NAMES = ("concurrency", "serial_key", "ordered", "rate_limit", "rate_key")


@dataclass(frozen=True)
class FlowLimits:
    """What limits how a kind's attempts start. ``None`` of everything is never built:
    an unlimited kind has no ``FlowLimits`` and keeps the plain claim path."""

    concurrency: int | None = None
    serial_key: KeyFunction | None = None
    ordered: bool = False
    rate_limit: tuple[int, float] | None = None
    rate_key: KeyFunction | None = None

    @property
    def keyed(self) -> bool:
        return self.serial_key is not None

    def describe(self) -> str:
        """The limits in words, for the status command and the admin (no key values)."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.serial_key is not None:
            parts.append("serial key, ordered" if self.ordered else "serial key")
        if self.rate_limit is not None:
            limit, period = self.rate_limit
            parts.append(f"rate {limit} per {period:g}s" + (" per rate key" if self.rate_key else ""))
        return ", ".join(parts)


def _accepts_one_argument(function: Callable[..., Any]) -> bool:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return True
    try:
        signature.bind(None)
    except TypeError:
        return False
    return True


def _check_key_function(kind: str, option: str, function: object) -> KeyFunction | None:
    if function is None:
        return None
    if not callable(function) or not _accepts_one_argument(function):
        raise RegistrationError(
            f"workflow {kind!r}: {option} must be a function of one argument (the trigger) "
            f"returning a string or None; got {type(function).__name__}"
        )
    if iscoroutinefunction(function):
        raise RegistrationError(
            f"workflow {kind!r}: {option} must be a plain function, not async def (enqueue "
            "calls it synchronously)"
        )
    return function


def _outside(value: object, *, whole: bool) -> str:
    """What is wrong with a number option's value, without the value itself."""
    name = type(value).__name__
    named = f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
    if isinstance(value, bool) or not isinstance(value, int if whole else int | float):
        return named
    if isinstance(value, float) and not math.isfinite(value):
        return f"{named} that is not finite"
    return f"{named} outside that range"


def _check_concurrency(kind: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= FLOW_CONCURRENCY_MAX:
        raise RegistrationError(
            f"workflow {kind!r}: concurrency must be a whole number from 1 to "
            f"{FLOW_CONCURRENCY_MAX:,} (attempts running at once across all runners), or None "
            f"for no cap; got {_outside(value, whole=True)}"
        )
    return value


def _check_rate_limit(kind: str, value: object) -> tuple[int, float] | None:
    if value is None:
        return None
    allowed = (
        f"workflow {kind!r}: rate_limit must be a pair (limit, period_seconds): a whole "
        f"number of starts from 1 to {RATE_LIMIT_MAX:,} and a number of seconds greater than 0 "
        f"and at most {RATE_PERIOD_MAX.total_seconds():,.0f} (a year)"
    )
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise RegistrationError(f"{allowed}; got {type(value).__name__}")
    limit, period = value
    if not is_rate_limit(limit):
        raise RegistrationError(f"{allowed}; the limit is {_outside(limit, whole=True)}")
    if not is_rate_period(period):
        raise RegistrationError(f"{allowed}; the period is {_outside(period, whole=False)}")
    return (limit, float(period))


def is_rate_limit(limit: object) -> TypeGuard[int]:
    """Whether ``limit`` may be a rate window's limit (``rate_limit`` and ``rate_limited``)."""
    return not isinstance(limit, bool) and isinstance(limit, int) and 1 <= limit <= RATE_LIMIT_MAX


def is_rate_period(period: object) -> TypeGuard[float]:
    """Whether ``period`` (seconds) may be a rate window's period, or a wait for one."""
    return (
        not isinstance(period, bool)
        and isinstance(period, int | float)
        and is_finite(period)  # 10**400 compared, never turned into a float
        and 0 < period <= RATE_PERIOD_MAX.total_seconds()
    )


def build_flow_limits(kind: str, *, deferred: bool, **options: Any) -> FlowLimits | None:
    """Check the flow options given to ``register``; raises :class:`RegistrationError`.

    Returns ``None`` when no option is set, so unlimited kinds keep the plain claim path.
    """
    # ``ordered=False`` is the default; 0 is a value (a bad one), so compare with ``is``.
    given = sorted(
        name
        for name in OPTION_NAMES
        if options.get(name) is not None and not (name == "ordered" and options.get(name) is False)
    )
    if not given:
        return None
    if not deferred:
        raise RegistrationError(
            f"workflow {kind!r}: {', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to "
            "deferred workflows only (register "
            "with a retry_schedule); fire-and-forget jobs run on django-rq, whose workers the "
            "database limits cannot hold back. Use nexus_workflows.rate_limited() inside prepare"
        )
    ordered = options.get("ordered", False)
    if not isinstance(ordered, bool):
        raise RegistrationError(
            f"workflow {kind!r}: ordered must be True or False; got {type(ordered).__name__}"
        )
    serial_key = _check_key_function(kind, "serial_key", options.get("serial_key"))
    if ordered and serial_key is None:
        raise RegistrationError(
            f"workflow {kind!r}: ordered=True needs a serial_key: items are ordered within a key"
        )
    rate_limit = _check_rate_limit(kind, options.get("rate_limit"))
    rate_key = _check_key_function(kind, "rate_key", options.get("rate_key"))
    if rate_key is not None and rate_limit is None:
        raise RegistrationError(
            f"workflow {kind!r}: rate_key needs a rate_limit: it gives each key its own limit"
        )
    return FlowLimits(
        concurrency=_check_concurrency(kind, options.get("concurrency")),
        serial_key=serial_key,
        ordered=ordered,
        rate_limit=rate_limit,
        rate_key=rate_key,
    )

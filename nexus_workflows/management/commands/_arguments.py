"""Argument types shared by the management commands: bounded, and never echoing what was
given (an argument may be patient data). Django lists no command for a module whose name
starts with an underscore."""

from __future__ import annotations

import math
from argparse import ArgumentTypeError
from collections.abc import Callable

from nexus_workflows.limits import MAX_DELAY

#: Longest number of seconds an argument takes: ten years, as for the settings.
MAX_SECONDS = MAX_DELAY.total_seconds()


def whole_number(least: int, most: int, what: str = "a whole number") -> Callable[[str], int]:
    """An argument type: an int from ``least`` to ``most``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:  # not a number, or too many digits to read
            number = least - 1
        if not least <= number <= most:
            raise ArgumentTypeError(f"must be {what} of at least {least} and at most {most:,}")
        return number

    return parse


def number(value: str) -> float:
    """An argument type: any float (the command checks its range), read without echoing it."""
    try:
        return float(value)
    except ValueError:
        raise ArgumentTypeError("must be a number") from None


def seconds(value: str) -> float:
    """An argument type: a number of seconds greater than 0 and at most MAX_SECONDS."""
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number <= MAX_SECONDS:
        raise ArgumentTypeError(
            f"must be a number of seconds greater than 0 and at most {MAX_SECONDS:,.0f} (ten years)"
        )
    return number

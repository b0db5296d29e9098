"""What may be shown of deferred work without the reveal permission.

Error messages are where patient names and phone numbers end up, so the admin without
``reveal_deferredwork`` and ``manage.py workflows status`` without ``--reveal`` show an
error's *type* only. ``last_error`` is written as ``"<ExceptionType>: <message>"``
(:func:`nexus_workflows.deferred.history.describe_error`); the type is what precedes the colon.
"""

from __future__ import annotations

import math
import re
import traceback
from typing import Any

# An exception class name, possibly dotted; anything else is not shown.
_TYPE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")

#: History reasons the runner writes itself (never from a workflow): safe to show.
APP_REASONS = frozenset(
    {
        "permanent error",
        "retry schedule exhausted",
        "lost too many times",
        "database unavailable",
        "reserved start lapsed",
    }
)


def error_type(text: str | None) -> str:
    """The exception type of a recorded error, ``"error"`` when it has no recognisable
    type, or ``""`` when nothing was recorded. Never any part of the message."""
    if not text or not text.strip():
        return ""
    head = text.strip().split("\n", 1)[0].split(":", 1)[0].strip()
    return head if _TYPE.fullmatch(head) else "error"


def raised_at(error: BaseException) -> str:
    """Where ``error`` was raised, as ``file.py:line in function`` (its innermost frame),
    for messages that must not chain the error itself: its message and the locals a
    traceback formatter may print can hold the value that caused it."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "unknown location"
    last = frames[-1]
    return f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name}"


def describe(value: Any) -> str:
    """What a value is (its type; a string's or a collection's length), never the value
    itself: settings may hold secrets (a URL with credentials, a key), and a caller's
    argument may be patient data passed in the wrong place."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, str):
        return f"a string of {len(value)} character(s)"
    if isinstance(value, list | tuple | dict | set | frozenset):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    if isinstance(value, float) and not math.isfinite(value):
        return "a float that is not finite"
    return f"a value of type {type(value).__name__}"

"""What a trigger may be: JSON values that come back from every database exactly as given.

A stored trigger is handed to ``prepare`` later, maybe after the row went through
PostgreSQL's ``jsonb``. So a trigger is accepted only when it will come back *equal and of
the same types*; anything else is refused before anything is written. The rules:

- dicts with ``str`` keys, lists, ``str``, ``bool``, ``None`` (inside a trigger; a trigger
  that *is* ``None`` is refused: the JSON column would take it for SQL NULL), ``int`` and
  ``float`` — these exact types: tuples and subclasses (``OrderedDict``, ``IntEnum`` …)
  would come back as the plain type;
- text that is valid Unicode (no lone surrogates) without the NUL character, which
  ``jsonb`` cannot store (the *text* ``"\\u0000"``, a backslash and five characters, is fine);
- integers from ``-2**63`` to ``2**63 - 1``, the range every backend's JSON functions
  treat as integers;
- finite floats of magnitude below ``1e16``, except ``-0.0``: ``jsonb`` stores numbers as
  ``numeric``, which has no negative zero and prints ``1e16`` (and every larger float) as
  an integer, so those would come back as ``0.0`` or as an ``int``;
- at most :data:`MAX_DEPTH` nested containers (fewer where the database stores fewer:
  ``sql.json_depth``, 31 on MariaDB), and no container inside itself.

The value is walked once, with an explicit stack (no recursion, so no ``RecursionError``).
Messages name the rule that was broken, never the value, which may carry patient data.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: Most containers nested inside one another (the trigger itself counts as one).
MAX_DEPTH = 64
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
#: Floats must be smaller than this in magnitude: jsonb gives larger ones back as ints.
FLOAT_LIMIT = 1e16


def allowed(max_depth: int = MAX_DEPTH) -> str:
    """What a value may be, for a message; ``max_depth`` below :data:`MAX_DEPTH` is the
    database's own limit and is said to be."""
    depth = f"nested at most {max_depth} deep"
    if max_depth < MAX_DEPTH:
        depth += " (this database's limit for JSON documents)"
    return (
        "allowed: dicts with string keys, lists, strings, booleans, None (not as the whole value), "
        f"integers from -2**63 to 2**63-1 and finite floats below 1e16 in magnitude (not -0.0), {depth}"
    )


ALLOWED = allowed()

_SCALARS = (str, bool, int, float, type(None))
_EXIT = object()


class Rejected(Exception):
    """Why a value cannot be stored; the caller turns it into its own exception."""


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored, or ``None``: lone surrogates and NUL characters."""
    if "\x00" in text:
        return "contains a NUL character (U+0000), which PostgreSQL cannot store"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains text that is not valid Unicode (a lone surrogate)"
    return None


def _type_problem(value: Any) -> str:
    name = type(value).__name__
    if isinstance(value, tuple):
        return f"found a value of type {name}; use a list (a tuple would come back as a list)"
    if isinstance(value, (dict, list, *_SCALARS)):
        return (
            f"found a value of type {name}, a subclass of a JSON type; convert it to the plain "
            "type (it would come back as that type)"
        )
    return f"found a value of type {name}"


def _scalar_problem(value: Any) -> str | None:
    kind = type(value)
    if kind is str:
        return text_problem(value)
    if kind is int:
        if not INT_MIN <= value <= INT_MAX:
            return "has an integer outside -2**63 … 2**63-1 (store larger numbers as strings)"
        return None
    if kind is float:
        if not math.isfinite(value):
            return "contains NaN or infinity"
        if value == 0.0 and math.copysign(1.0, value) < 0:
            return "contains -0.0, which PostgreSQL's jsonb gives back as 0.0"
        if abs(value) >= FLOAT_LIMIT:
            return (
                "has a float of magnitude 1e16 or more, which PostgreSQL's jsonb gives back as an "
                "integer (use an int, or a string)"
            )
        return None
    return None  # bool or None


def check(value: Any, *, allow_none: bool = False, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`Rejected` unless ``value`` round-trips exactly (see the module doc)
    and nests at most ``max_depth`` containers."""
    if value is None and not allow_none:
        raise Rejected("is None (JSON null), which the JSON column would store as SQL NULL")
    on_path: set[int] = set()
    stack: list[Any] = [(value, 1)]
    while stack:
        item = stack.pop()
        if item[0] is _EXIT:
            on_path.discard(item[1])
            continue
        current, depth = item
        kind = type(current)
        if kind in _SCALARS:
            problem = _scalar_problem(current)
            if problem:
                raise Rejected(problem)
            continue
        if kind is not dict and kind is not list:
            raise Rejected(_type_problem(current))
        if id(current) in on_path:
            raise Rejected("contains a circular reference")
        if depth > max_depth:
            raise Rejected(f"is nested more than {max_depth} containers deep")
        on_path.add(id(current))
        stack.append((_EXIT, id(current)))
        if kind is dict:
            for key, child in current.items():
                if type(key) is not str:
                    raise Rejected(
                        f"has a dict key of type {type(key).__name__}; keys must be strings "
                        "(other keys would come back changed)"
                    )
                problem = text_problem(key)
                if problem:
                    raise Rejected(f"has a dict key that {problem}")
                stack.append((child, depth + 1))
        else:
            stack.extend((child, depth + 1) for child in current)


def nested_deeper(value: Any, max_depth: int) -> bool:
    """Whether ``value``, JSON that ``json.dumps`` took (so no cycle), nests more than
    ``max_depth`` containers: the one rule of :func:`check` for a value whose other rules
    are looser (a task's return value)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if type(current) not in (dict, list):
            continue
        if depth > max_depth:
            return True
        children = current.values() if type(current) is dict else current
        stack.extend((child, depth + 1) for child in children)
    return False


def dumps(value: Any) -> str:
    """JSON text of a value :func:`check` accepted (bounded depth: safe to encode)."""
    return json.dumps(value, allow_nan=False)

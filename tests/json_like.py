"""Hypothesis strategies for hostile JSON-like Python values, and an exact comparison.

Shared by the trigger tests (SQLite and PostgreSQL) and the PHI tests.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import strategies as st

# Every code point, lone surrogates and NUL included (Hypothesis leaves surrogates out by
# default), with the troublesome ones drawn often.
any_character = st.characters(exclude_categories=()) | st.sampled_from(
    ["\x00", "\ud800", "\udfff", "\\", "\uffff", "\U0001f600", "é", "\u2028"]
)
any_text = st.text(any_character, max_size=12) | st.sampled_from(
    ["C:\\u0000\\dir", "\\ud800", "", " ", "null"]
)
edge_integers = st.sampled_from(
    [0, -1, 2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**20, 10**400]
) | st.just(5000).map(lambda digits: 10**digits)  # mapped: sampled_from would repr it
edge_floats = st.sampled_from(
    [0.0, -0.0, 1e15 + 0.5, 9999999999999998.0, 1e16, 1e20, 1e308, 5e-324, 1e-7, -2.5, 0.1]
)
scalars = st.none() | st.booleans() | st.integers() | edge_integers | st.floats() | edge_floats | any_text
# Mostly string keys, sometimes keys JSON would rewrite.
keys = any_text | st.integers(-3, 3) | st.booleans() | st.none() | st.floats(allow_nan=False)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=4)
        | st.dictionaries(keys, children, max_size=4)
        | st.tuples(children, children)
    )


json_like = st.recursive(scalars, _containers, max_leaves=12)

# Only what a trigger may be (the rules InvalidTrigger enforces): text that is valid Unicode
# without NUL, 64-bit integers, finite floats below 1e16 in magnitude other than -0.0, and
# lists and dicts with text keys. So a property over it fails if a valid value is refused.
valid_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
valid_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(min_value=-1e16, max_value=1e16, exclude_min=True, exclude_max=True).filter(
        lambda number: math.copysign(1.0, number) > 0 or number != 0
    )
    | valid_text
)
valid_json = st.recursive(
    valid_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(valid_text, children, max_size=4),
    max_leaves=12,
).filter(lambda value: value is not None)  # None as the whole trigger is refused


def same(stored: Any, given: Any) -> bool:
    """Equal and of the same types, recursively; -0.0 and 0.0 are different."""
    if type(stored) is not type(given):
        return False
    if isinstance(given, float):
        return stored == given and math.copysign(1.0, stored) == math.copysign(1.0, given)
    if isinstance(given, dict):
        return stored.keys() == given.keys() and all(same(stored[key], given[key]) for key in given)
    if isinstance(given, list):
        return len(stored) == len(given) and all(map(same, stored, given))
    return stored == given


def nested(depth: int) -> list[Any]:
    """A list nested ``depth`` lists deep (the outermost one included)."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value

"""nexus_workflows.json_values: the one walk of a trigger, without a database."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from nexus_workflows import json_values
from nexus_workflows.json_values import MAX_DEPTH, Rejected, check, text_problem
from tests.json_like import nested


def test_deep_nesting_is_refused_without_recursion() -> None:
    deep = nested(sys.getrecursionlimit() * 20)
    with pytest.raises(Rejected, match=f"nested more than {MAX_DEPTH}"):
        check(deep)
    deep_dict: dict[str, Any] = {}
    for _ in range(50_000):
        deep_dict = {"a": deep_dict}
    with pytest.raises(Rejected, match="nested"):
        check(deep_dict)


def test_the_depth_limit_counts_the_trigger_itself() -> None:
    check(nested(MAX_DEPTH))
    check({"a": nested(MAX_DEPTH - 1)})
    with pytest.raises(Rejected):
        check({"a": nested(MAX_DEPTH)})


def test_shared_containers_are_fine_cycles_are_not() -> None:
    shared = [1, 2]
    check({"a": shared, "b": [shared, shared]})
    loop: list[Any] = []
    loop.append([loop])
    with pytest.raises(Rejected, match="circular"):
        check({"x": loop})


def test_none_is_refused_as_the_whole_value_only() -> None:
    check([None, {"a": None}])
    check(None, allow_none=True)
    with pytest.raises(Rejected, match="None"):
        check(None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("plain", None),
        ("C:\\u0000\\dir", None),
        ("ñ \U0001f600", None),
        ("a\x00", "NUL"),
        ("\ud83d", "not valid Unicode"),
        ("\ud83d\ude00", "not valid Unicode"),  # a surrogate *pair* in a str is still two lone ones
    ],
)
def test_text_problems(text: str, problem: str | None) -> None:
    found = text_problem(text)
    assert (found is None) if problem is None else (problem in found)


def test_dumps_is_plain_json_of_what_was_checked() -> None:
    value = {"a": [1, 2.5, "x", None, True]}
    check(value)
    assert json_values.dumps(value) == '{"a": [1, 2.5, "x", null, true]}'

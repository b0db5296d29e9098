"""Formulas the helpers accept: pyairtable formula objects or ``{field: value}`` dicts.

A dict becomes an equality match of every field, built with pyairtable's ``EQ`` and
``Field``, which quote and escape each value: a value is always a literal, whatever
quotes, braces or formula syntax it contains. Formula *text* (a ``str``) is refused,
because text built by concatenating values is how a value turns into formula code. A
caller who really has constant formula text wraps it in ``pyairtable.formulas.Formula``
on purpose.

Messages name fields and types, never values.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, TypeAlias

from pyairtable.formulas import AND, EQ, Field, Formula

from nexus_workflows.airtable.exceptions import InvalidFormula
from nexus_workflows.json_values import INT_MAX, INT_MIN
from nexus_workflows.numbers import is_finite

#: Types of the values of a ``{field: value}`` formula.
LITERAL_TYPES = (str, bool, int, float, Decimal, datetime.date)
FormulaValue: TypeAlias = str | bool | int | float | Decimal | datetime.date
FormulaInput: TypeAlias = Formula | Mapping[str, FormulaValue]

_ALLOWED = (
    "a pyairtable formula object (pyairtable.formulas.match(), EQ(), Field()...) or a {field: value} dict"
)


def to_formula(formula: object, *, what: str = "formula") -> Formula:
    """The pyairtable formula for ``formula``; :class:`InvalidFormula` when it is neither
    a formula object nor a dict of field names to literal values."""
    if isinstance(formula, Formula):
        return formula
    if isinstance(formula, Mapping):
        return equality_match(formula, what=what)
    if isinstance(formula, str):
        raise InvalidFormula(
            f"{what} must be {_ALLOWED}; got formula text (str), which is refused because values "
            "concatenated into formula text can change its meaning"
        )
    raise InvalidFormula(f"{what} must be {_ALLOWED}; got {type(formula).__name__}")


def equality_match(values: Mapping[Any, Any], *, what: str = "formula") -> Formula:
    """``{A}=value_a`` for one field, ``AND({A}=value_a, {B}=value_b, ...)`` for several.

    Unlike ``pyairtable.formulas.match``, a tuple value is not read as an
    ``(operator, value)`` pair: every value is compared for equality, literally.
    """
    if not values:
        raise InvalidFormula(f"{what} must name at least one field; got an empty dict")
    comparisons: list[Formula] = []
    for field, value in values.items():
        if not isinstance(field, str) or not field.strip():
            raise InvalidFormula(f"{what}: field names must be non-empty strings; got {type(field).__name__}")
        _check_literal(field, value, what)
        comparisons.append(EQ(Field(field), value))
    return comparisons[0] if len(comparisons) == 1 else AND(*comparisons)


def _check_literal(field: str, value: object, what: str) -> None:
    if value is None:
        raise InvalidFormula(
            f"{what}: the value for field {field!r} is None; to match an empty cell pass "
            "a formula object such as EQ(Field(name), BLANK())"
        )
    if isinstance(value, Formula):
        raise InvalidFormula(
            f"{what}: the value for field {field!r} is a formula object; dict values are compared "
            "as literals, so pass the whole condition as a formula object instead"
        )
    if not isinstance(value, LITERAL_TYPES):
        raise InvalidFormula(
            f"{what}: the value for field {field!r} must be a str, bool, int, float, Decimal, "
            f"date or datetime; got {type(value).__name__}"
        )
    if isinstance(value, float | Decimal) and not is_finite(value):  # a signalling NaN too
        raise InvalidFormula(f"{what}: the value for field {field!r} must be a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and not INT_MIN <= value <= INT_MAX:
        # Beyond what a formula can write out (4,300 digits) long before Airtable's numbers end.
        raise InvalidFormula(
            f"{what}: the value for field {field!r} must be an integer from -2**63 to 2**63-1"
        )

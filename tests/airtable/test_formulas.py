"""Formulas: dicts become literal equality matches; formula text is refused."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest
from pyairtable.formulas import GT, Field, Formula, match

from nexus_workflows.airtable import (
    AirtableHTTPError,
    InvalidFormula,
    get_record_by_filter,
    get_records,
    to_formula,
    update_record_by_filter,
)
from tests.airtable.conftest import BASE
from tests.airtable.emulator import AirtableEmulator, FormulaError, parse_formula

HOSTILE = "x' , TRUE()) & OR(1=1, '"


def test_a_dict_becomes_an_equality_match() -> None:
    assert str(to_formula({"Name": "Jane's"})) == r"{Name}='Jane\'s'"
    assert str(to_formula({"Name": "a", "Age": 21, "Active": True})) == (
        "AND({Name}='a', {Age}=21, {Active}=TRUE())"
    )
    assert str(to_formula({"Seen": datetime.date(2026, 12, 1)})) == "{Seen}=DATETIME_PARSE('2026-12-01')"


def test_a_formula_object_is_used_as_it_is() -> None:
    formula = GT(Field("Age"), 21)
    assert to_formula(formula) is formula
    assert str(to_formula(match({"Name": "a"}))) == "{Name}='a'"


def test_the_hostile_value_is_escaped_into_one_string_literal() -> None:
    text = str(to_formula({"Name": HOSTILE}))

    assert text == r"{Name}='x\' , TRUE()) & OR(1=1, \''"
    assert parse_formula(text) == ("eq", "Name", HOSTILE)
    # What string concatenation would have sent is not a formula with that meaning.
    with pytest.raises(FormulaError):
        parse_formula("{Name}='" + HOSTILE + "'")


def test_a_tuple_value_is_a_literal_not_an_operator() -> None:
    # pyairtable.formulas.match() would read (">=", 21) as "Age >= 21".
    with pytest.raises(InvalidFormula, match="must be a str, bool, int"):
        to_formula({"Age": (">=", 21)})


@pytest.mark.parametrize(
    ("formula", "message"),
    [
        ("{Name}='a'", "got formula text"),
        ({}, "at least one field"),
        ({"Name": None}, "is None"),
        ({"Name": Formula("TRUE()")}, "is a formula object"),
        ({"Name": ["a"]}, "got list"),
        ({"Age": float("nan")}, "finite number"),
        ({"Age": Decimal("Infinity")}, "finite number"),
        ({"Age": Decimal("sNaN")}, "finite number"),  # math.isfinite raised ValueError
        ({"Age": 10**5000}, "integer from -2"),  # its digits could not even be written
        ({1: "a"}, "field names must be non-empty strings"),
        ({" ": "a"}, "field names must be non-empty strings"),
        (42, "got int"),
    ],
)
def test_unusable_formulas_are_refused_with_a_reason(formula: Any, message: str) -> None:
    with pytest.raises(InvalidFormula, match=message) as caught:
        to_formula(formula)
    assert caught.value.permanent is True


def test_refusals_never_quote_the_value() -> None:
    with pytest.raises(InvalidFormula) as caught:
        to_formula("{Name}='Maria Lopez'")
    assert "Maria" not in str(caught.value)


def test_a_formula_injection_value_is_sent_as_a_literal(airtable: AirtableEmulator) -> None:
    airtable.add(BASE, "Patients", {"Name": "alice"})
    airtable.add(BASE, "Patients", {"Name": "bob"})
    target = airtable.add(BASE, "Patients", {"Name": HOSTILE})

    found = get_records(BASE, "Patients", formula={"Name": HOSTILE})
    first = get_record_by_filter(BASE, "Patients", {"Name": HOSTILE})

    assert [r["id"] for r in found] == [target["id"]]
    assert first is not None
    assert first["id"] == target["id"]
    for request in airtable.requests_for("GET"):
        assert request.formula == r"{Name}='x\' , TRUE()) & OR(1=1, \''"
        assert parse_formula(request.formula) == ("eq", "Name", HOSTILE)


def test_an_injected_update_touches_only_the_literal_match(airtable: AirtableEmulator) -> None:
    airtable.add(BASE, "Patients", {"Name": "alice", "Flag": "no"})
    airtable.add(BASE, "Patients", {"Name": "bob", "Flag": "no"})

    assert update_record_by_filter(BASE, "Patients", {"Name": HOSTILE}, {"Flag": "yes"}) == []

    assert [r["fields"]["Flag"] for r in airtable.records(BASE, "Patients")] == ["no", "no"]
    assert airtable.requests_for("PATCH") == []


def test_the_emulator_rejects_concatenated_formula_text(airtable: AirtableEmulator) -> None:
    # The control experiment: had the helpers concatenated the value into the formula,
    # the request would not have been a literal match (here: an invalid formula).
    airtable.add(BASE, "Patients", {"Name": "alice"})

    with pytest.raises(AirtableHTTPError) as caught:
        get_records(BASE, "Patients", formula=Formula("{Name}='" + HOSTILE + "'"))

    assert (caught.value.status, caught.value.error_type) == (422, "INVALID_FILTER_BY_FORMULA")


def test_a_formula_is_refused_before_anything_is_sent(airtable: AirtableEmulator) -> None:
    with pytest.raises(InvalidFormula):
        get_records(BASE, "Patients", formula="{Name}='a'")  # type: ignore[arg-type]
    with pytest.raises(InvalidFormula):
        update_record_by_filter(BASE, "Patients", {"Name": None}, {"Flag": "yes"})
    assert airtable.requests == []

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import override_settings

from nexus_workflows.phi import CATEGORIES, InvalidCategory, InvalidPhiValue, normalize
from nexus_workflows.phi.normalization import is_richer, richness, surface_form

# Pure Python: bin/test runs it once per Django line.
pytestmark = pytest.mark.database_independent


def test_categories() -> None:
    assert CATEGORIES == ("PERSONA", "TELEFONO", "EMAIL", "ID")


@pytest.mark.parametrize(
    ("category", "spellings", "normalized"),
    [
        (
            "PERSONA",
            ["  MARÍA   López ", "maria lopez", "María López", "MARIA\tLOPEZ", "Mari\u0301a Lo\u0301pez"],
            "maria lopez",
        ),
        ("PERSONA", ["José Ñúñez", "jose nunez", "JOSÉ  ÑÚÑEZ"], "jose nunez"),
        ("TELEFONO", ["55 1234 5678", "+52 55 1234 5678", "(55) 1234-5678", "5512345678"], "+525512345678"),
        ("EMAIL", ["  Maria.Lopez@Example.COM ", "maria.lopez@example.com"], "maria.lopez@example.com"),
        ("ID", ["abc-123.456 7", "ABC123456/7", " a b c 1 2 3 4 5 6 7 "], "ABC1234567"),
    ],
)
def test_spellings_of_one_value_normalise_alike(category: str, spellings: list[str], normalized: str) -> None:
    assert {normalize(spelling, category) for spelling in spellings} == {normalized}


def test_numbers_are_accepted_as_their_text() -> None:
    assert normalize(5512345678, "TELEFONO") == "+525512345678"
    assert normalize(5512345678.0, "TELEFONO") == "+525512345678"
    assert normalize(Decimal("5512345678"), "TELEFONO") == "+525512345678"
    assert normalize(123456, "ID") == "123456"


def test_default_region_comes_from_settings() -> None:
    with override_settings(NEXUS_WORKFLOWS={"PHI_DEFAULT_REGION": "US"}):
        assert normalize("(650) 253-0000", "TELEFONO") == "+16502530000"
    assert normalize("(650) 253-0000", "TELEFONO") != "+16502530000"


@pytest.mark.parametrize(
    ("category", "first", "second"),
    [
        ("PERSONA", "María López", "Mario López"),
        ("PERSONA", "María López", "María López Núñez"),
        ("TELEFONO", "55 1234 5678", "55 1234 5679"),
        ("TELEFONO", "+52 55 1234 5678", "+1 55 1234 5678"),
        ("EMAIL", "maria@example.com", "maria@example.org"),
        ("ID", "ABC-123", "ABC-124"),
    ],
)
def test_different_values_stay_apart(category: str, first: str, second: str) -> None:
    assert normalize(first, category) != normalize(second, category)


@pytest.mark.parametrize(
    ("value", "category"),
    [
        (None, "PERSONA"),
        ("", "PERSONA"),
        ("   \t ", "EMAIL"),
        ("\u0301", "PERSONA"),  # a lone combining accent: nothing left
        ("--/..", "ID"),
        ("call me maybe", "TELEFONO"),
        ("12", "TELEFONO"),
        (True, "ID"),
        (["a"], "PERSONA"),
        (float("nan"), "TELEFONO"),
    ],
)
def test_bad_values_raise_without_echoing_them(value: object, category: str) -> None:
    with pytest.raises(InvalidPhiValue) as raised:
        normalize(value, category)
    assert category in str(raised.value)
    if isinstance(value, str) and value.strip():
        assert value not in str(raised.value)


@pytest.mark.parametrize("category", ["persona", "NAME", "", None, 3])
def test_unknown_category_lists_the_allowed_ones(category: object) -> None:
    with pytest.raises(InvalidCategory) as raised:
        normalize("x", category)  # type: ignore[arg-type]
    assert "PERSONA, TELEFONO, EMAIL, ID" in str(raised.value)


@pytest.mark.parametrize("category", ["María López", "55 1234 5678", "MARIA", "persona"])
def test_an_unknown_category_is_never_echoed(category: str) -> None:
    # A value passed as the category (arguments swapped) is patient data.
    with pytest.raises(InvalidCategory) as raised:
        normalize("x", category)
    message = str(raised.value)
    assert category not in message
    assert "allowed: PERSONA, TELEFONO, EMAIL, ID" in message


def test_surface_form_trims_and_composes_and_keeps_inner_whitespace() -> None:
    assert surface_form("  Mari\u0301a \t López  ") == "María \t López"
    # Kept as written so that decode(encode_text(x)) == x for a pasted number.
    assert surface_form("55\u00a01234\u00a05678") == "55\u00a01234\u00a05678"


def test_whitespace_does_not_make_a_surface_richer() -> None:
    assert richness("María  López") == richness("María López")
    assert not is_richer("María \t López", "María López")


@pytest.mark.parametrize(
    ("richer", "poorer"),
    [
        ("María López", "maria lopez"),  # accents
        ("maría lópez", "María Lopez"),  # more accents beat mixed case
        ("María López", "MARÍA LÓPEZ"),  # same accents: mixed case beats all-upper
        ("María López", "maría lópez"),  # ... and all-lower
        ("Maria Lopez Nunez", "Maria Lopez"),  # then longer
        ("+52 55 1234 5678", "55 1234 5678"),
    ],
)
def test_richness_order(richer: str, poorer: str) -> None:
    assert richness(richer) > richness(poorer)
    assert is_richer(richer, poorer)
    assert not is_richer(poorer, richer)


def test_equal_richness_is_not_richer() -> None:
    assert not is_richer("Maria Lopez", "Maria Lopez")
    assert not is_richer("ABC-123", "ABC 123")

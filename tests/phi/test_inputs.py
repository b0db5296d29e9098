"""Hostile inputs to encode, encode_text and decode: a PhiError, or a faithful round trip.

What comes back from ``decode`` is the stored *surface* (NFC, trimmed, whitespace runs
collapsed: :func:`surface_form`), so "faithful" means ``decode(encode(v)) ==
surface_form(text of v)``.
"""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_workflows.phi import (
    CATEGORIES,
    InvalidCode,
    InvalidPhiValue,
    PhiError,
    decode,
    encode,
    encode_text,
)
from nexus_workflows.phi.cache import token_cache
from nexus_workflows.phi.models import PhiToken, TokenMap
from nexus_workflows.phi.normalization import surface_form, value_text
from tests.json_like import any_text

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("Mar\ud800ía", "not valid Unicode"),
        ("\udfff", "not valid Unicode"),
        (10**5000, "too large"),
        (-(10**5000), "too large"),
        (10**64, "too large"),
        (1e308, "too large"),
        (Decimal("1e999999999"), "too large"),
        (Decimal("sNaN"), "not a finite number"),
        (Decimal("NaN"), "not a finite number"),
        (Decimal("-Infinity"), "not a finite number"),
        (float("nan"), "not a finite number"),
    ],
    ids=lambda item: type(item).__name__,
)
def test_values_that_cannot_be_text_raise_invalid_phi_value(code: str, value: Any, rule: str) -> None:
    with pytest.raises(InvalidPhiValue, match=rule) as raised:
        encode(code, value, "ID")
    assert "allowed" in str(raised.value) or "pass" in str(raised.value)
    assert "María" not in str(raised.value)
    assert not TokenMap.objects.exists()


def test_a_value_longer_than_a_thousand_characters_is_refused(code: str) -> None:
    """An 8 MB value was stored as an 11 MB ciphertext row (and cached)."""
    refused = "PERSONA value has 1,001 characters; a value has at most 1,000"
    with pytest.raises(InvalidPhiValue, match=refused):
        encode(code, "María López " + "x" * 989, "PERSONA")
    assert not TokenMap.objects.exists()
    token = encode(code, "María " + "x" * 994, "PERSONA")  # 1,000: taken
    token_cache.clear()
    assert decode(code, token) == "María " + "x" * 994


@pytest.mark.parametrize("value", [10**63, Decimal("5512345678.0"), Decimal("-12.50"), 5512345678.0])
def test_numbers_within_the_bound_are_their_text(code: str, value: Any) -> None:
    token = encode(code, value, "ID")
    token_cache.clear()
    assert decode(code, token) == value_text(value, "ID")


@pytest.mark.parametrize("bad", ["conv-\ud800", "\udc00"])
def test_a_conversation_code_that_is_not_valid_unicode_raises_invalid_code(bad: str) -> None:
    for call in (
        lambda: encode(bad, "María", "PERSONA"),
        lambda: decode(bad, "<<PERSONA_1>>"),
        lambda: encode_text(bad, "Soy María", spans=[(4, 9, "PERSONA")]),
    ):
        with pytest.raises(InvalidCode, match="not valid Unicode"):
            call()
    assert not TokenMap.objects.exists()


def test_a_span_over_a_lone_surrogate_raises_and_writes_nothing(code: str) -> None:
    text = "Soy Mar\ud800ía y mi correo es maria@example.com"
    with pytest.raises(InvalidPhiValue, match=r"span \(4, 12\): PERSONA value is not valid Unicode"):
        encode_text(code, text, spans=[(4, 12, "PERSONA")])
    assert not TokenMap.objects.exists()
    assert not PhiToken.objects.exists()


def test_lone_surrogates_outside_spans_pass_through_unchanged(code: str) -> None:
    text = "\ud800 Soy María \udfff"
    encoded = encode_text(code, text, spans=[(6, 11, "PERSONA")])
    assert encoded == "\ud800 Soy <<PERSONA_1>> \udfff"
    assert decode(code, encoded) == text


PROPERTY = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
values = (
    any_text
    | st.integers()
    | st.floats()
    | st.decimals()
    | st.sampled_from([Decimal("sNaN"), Decimal("1e999999999"), True, None, b"x"])
    | st.just(5000).map(lambda digits: 10**digits)
)


@PROPERTY
@given(value=values, category=st.sampled_from(CATEGORIES))
def test_any_value_is_refused_or_decodes_to_its_surface(value: Any, category: str) -> None:
    code = f"conv-{uuid.uuid4().hex}"  # one per example: a richer earlier spelling would win
    try:
        token = encode(code, value, category)
    except PhiError:
        return
    token_cache.clear()  # decode what is stored
    assert decode(code, token) == surface_form(value_text(value, category))


# Only what a PERSONA or ID value may be: valid Unicode text of at most 1,000 characters with
# a letter or digit in it, or a finite number of at most 64 digits. (TELEFONO and EMAIL take
# only what parses as one, so they have hand-written cases.)
_around = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
valid_values = (
    st.tuples(_around, st.sampled_from("aZé9ñ"), _around).map("".join)
    | st.integers(-(10**64) + 1, 10**64 - 1)
    | st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=-(10**20), max_value=10**20)
)


@PROPERTY
@given(value=valid_values, category=st.sampled_from(["PERSONA", "ID"]))
def test_any_valid_value_decodes_to_its_surface(value: Any, category: str) -> None:
    """The other half of the property above, which would hold if every value were refused."""
    code = f"conv-{uuid.uuid4().hex}"
    token = encode(code, value, category)
    token_cache.clear()
    assert decode(code, token) == surface_form(value_text(value, category))


@PROPERTY
@given(text=any_text, category=st.sampled_from(CATEGORIES), data=st.data())
def test_any_span_is_refused_or_decodes_to_its_surface(text: str, category: str, data: st.DataObject) -> None:
    code = f"conv-{uuid.uuid4().hex}"
    if not text:
        return
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    try:
        encoded = encode_text(code, text, spans=[(start, end, category)])
    except PhiError:
        return
    token_cache.clear()
    decoded = decode(code, encoded)
    # The span (and anything found around it) comes back as its surface form.
    assert surface_form(text[start:end]) in decoded

"""The recognisers against the annotated corpus of patient messages (benchmarks/data).

The corpus is made once by benchmarks/make_phi_corpus.py and checked in; its spans come from
where the generator inserted each identifier, not from any recogniser. Every message is
checked span by span (fast, no database); a fixed subset goes through encode_text and
decode against exact expected texts; every message without an identifier goes through
encode_text and must come back unchanged without a write.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.make_phi_corpus import CORPUS, build, serialise
from nexus_workflows.phi import decode, encode_text, find_spans, normalize
from nexus_workflows.phi.models import TokenMap
from nexus_workflows.phi.tokens import TOKEN_PATTERN

ROWS = [json.loads(line) for line in Path(CORPUS).read_text(encoding="utf-8").splitlines()]
PHI_ROWS = [row for row in ROWS if row["spans"]]
CLEAN_ROWS = [row for row in ROWS if not row["spans"]]
# The fixed subset that goes through the database: the first 40 messages (20 of each kind).
SUBSET = ROWS[:40]


def test_the_corpus_is_what_its_generator_makes() -> None:
    assert Path(CORPUS).read_text(encoding="utf-8") == serialise(build())


def test_the_corpus_has_its_shape() -> None:
    assert len(ROWS) >= 300
    assert len(CLEAN_ROWS) == len(PHI_ROWS)
    categories = {span[2] for row in PHI_ROWS for span in row["spans"]}
    assert categories == {"TELEFONO", "EMAIL", "ID"}
    assert any("\n" in row["text"] for row in ROWS)
    assert any(not row["text"].isascii() for row in CLEAN_ROWS)


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"message-{row['id']}")
def test_every_annotated_span_and_nothing_else_is_found(row: dict) -> None:
    text = row["text"]
    expected = [(start, end, category) for start, end, category, _ in row["spans"]]
    assert find_spans(text) == sorted(expected)
    for start, end, category, value in row["spans"]:
        assert normalize(text[start:end], category) == value


def expected_encoding(row: dict) -> str:
    """The message with each annotated span replaced by the token a fresh conversation gives
    it: numbered in order of first appearance, one number per (category, value)."""
    numbers: dict[tuple[str, str], int] = {}
    pieces, position = [], 0
    for start, end, category, value in sorted(row["spans"]):
        number = numbers.setdefault((category, value), len(numbers) + 1)
        pieces += [row["text"][position:start], f"<<{category}_{number}>>"]
        position = end
    return "".join([*pieces, row["text"][position:]])


@pytest.mark.django_db
@pytest.mark.parametrize("row", SUBSET, ids=lambda row: f"message-{row['id']}")
def test_encode_text_of_the_fixed_subset(row: dict) -> None:
    code = f"corpus-{row['id']}"
    encoded = encode_text(code, row["text"])
    assert encoded == expected_encoding(row)
    assert decode(code, encoded) == row["text"]
    assert TokenMap.objects.filter(code=code).exists() == bool(row["spans"])


@pytest.mark.django_db
def test_messages_without_identifiers_come_back_unchanged_and_write_nothing() -> None:
    for row in CLEAN_ROWS:
        assert encode_text("corpus-clean", row["text"]) == row["text"]
    assert not TokenMap.objects.exists()


@pytest.mark.django_db
def test_one_conversation_gives_one_token_per_value_across_spellings() -> None:
    tokens: dict[tuple[str, str], str] = {}
    for row in PHI_ROWS:
        encoded = encode_text("corpus-all", row["text"])
        for (start, end, category, value), token in zip(
            sorted(row["spans"]), TOKEN_PATTERN.findall(encoded), strict=True
        ):
            assert tokens.setdefault((category, value), token) == token, row["text"][start:end]
    assert len(set(tokens.values())) == len(tokens)

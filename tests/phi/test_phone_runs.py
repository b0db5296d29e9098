"""The phone recogniser finds exactly what it found before it was made fast on long runs.

tests/phi/data/phone_runs.json holds the answers of ``find_phones`` as it was before (made
by tests/phi/phone_runs_corpus.py from a copy of that module): several thousand seeded
inputs — digits with every separator, cue words, phone-shaped numbers, long runs of
spaced digits (4,096 and 20,000 characters), the PHI corpus, the look-alike generators
and the strings of the recogniser tests. Every detection must be the same: span, E.164
value and cue. What it costs is measured by benchmarks/phi_phone_runs.py, not here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nexus_workflows.phi.recognizers import find_phones

# Pure Python: bin/test runs it once per Django line.
pytestmark = pytest.mark.database_independent

FIXTURE = Path(__file__).resolve().parent / "data" / "phone_runs.json"
ENTRIES: list[tuple[str, str, list[list[object]]]] = json.loads(FIXTURE.read_text(encoding="ascii"))


def _differences(entries: list[tuple[str, str, list[list[object]]]]) -> list[str]:
    differences = []
    for text, region, expected in entries:
        found = [[d.start, d.end, d.value, d.cued] for d in find_phones(text, region)]
        if found != expected:
            differences.append(f"{text[:80]!r}… ({len(text)} chars, {region}): {found} != {expected}")
    return differences


def test_the_corpus_has_its_shape() -> None:
    assert len(ENTRIES) >= 5000
    assert sum(len(text) >= 20_000 for text, _, _ in ENTRIES) >= 2
    assert sum(len(text) >= 4096 for text, _, _ in ENTRIES) >= 15
    assert {region for _, region, _ in ENTRIES} >= {"MX", "US"}
    assert sum(bool(expected) for _, _, expected in ENTRIES) >= 1000


def test_short_inputs_find_what_they_found() -> None:
    differences = _differences([entry for entry in ENTRIES if len(entry[0]) < 4096])
    assert differences == [], f"{len(differences)} inputs differ; first: {differences[:5]}"


def test_long_runs_find_what_they_found() -> None:
    differences = _differences([entry for entry in ENTRIES if len(entry[0]) >= 4096])
    assert differences == [], f"{len(differences)} inputs differ; first: {differences[:5]}"

"""Clinical values and folios shaped like phone numbers: hidden before, left now, while
the phone numbers they look like are still found (see nexus_workflows/phi/clinical.py).

A false positive hides a clinical value from the LLM (safe, but bad for care); a miss
sends a number in clear (the worst error). So every rule here has guards: the same digits
after a phone cue word, without a label, or with values no one measurement has.
"""

from __future__ import annotations

import random
import time

import pytest

from benchmarks.phi_lookalikes import messages
from nexus_workflows.phi import find_spans
from nexus_workflows.phi.recognizers import find

# Pure Python: bin/test runs it once per Django line.
pytestmark = pytest.mark.database_independent


def found(text: str) -> list[str]:
    return [text[start:end] for start, end, category in find_spans(text) if category == "TELEFONO"]


# --- values in a row after a clinical label or before a unit --------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # Five heart rates: a valid Mexican number in pairs (+52 918 890 8473).
        "FC 91 88 90 84 73",
        "F.C. 91 88 90 84 73",
        "frecuencia cardiaca 91 88 90 84 73",
        "la FC de hoy fue 91 88 90 84 73",
        "FC: 72 91 88 90 84 73",  # six values: no window of five is a number
        "TA 120/80 FC 91 88 90 84 73 FR 18",
        "91 88 90 84 73 lpm",
        "pulsos 91 88 90 84 73 x min",
        "saturación 96 96 98 94 89",
        "FC \uff19\uff11 \uff18\uff18 \uff19\uff10 \uff18\uff14 \uff17\uff13",  # full-width digits
        # Lab values with the area code alone and groups of two and three digits.
        "glucosa 284 255 95 98",
        "glucosa en ayunas 81 111 85 114",
        "la glucosa 81 111 85 114 mg/dl",
        "peso 56 101 110 60 99 kg",
    ],
)
def test_a_list_of_clinical_values_is_not_a_phone(text: str) -> None:
    assert found(f"Buenas tardes doctora, {text}. Gracias") == []


@pytest.mark.parametrize(
    ("text", "phones"),
    [
        # A phone cue word before the digits: a number, whatever else stands around.
        ("cel 91 88 90 84 73", ["91 88 90 84 73"]),
        ("FC 80, cel 91 88 90 84 73", ["91 88 90 84 73"]),
        ("FC 80 mi whatsapp es 91 88 90 84 73", ["91 88 90 84 73"]),
        ("mi número 91 88 90 84 73 lpm", ["91 88 90 84 73"]),
        # No label before and no unit after: a number.
        ("91 88 90 84 73", ["91 88 90 84 73"]),
        ("81 111 85 114", ["81 111 85 114"]),
        ("llámame al 91 88 90 84 73", ["91 88 90 84 73"]),
        # The label is on another line, or something else stands between.
        ("pulso 80\n91 88 90 84 73", ["91 88 90 84 73"]),
        ("glucosa 110 mg/dl, 55 12 34 56 78", ["55 12 34 56 78"]),
        ("folio 483920 cel 55 12 34 56 78", ["55 12 34 56 78"]),
        # After a label, but no one measurement's values (a leading zero, a spread over
        # three times), or a group of four digits: a number.
        ("glucosa 55 12 34 56 78", ["55 12 34 56 78"]),
        ("FC 99 81 23 45 67", ["99 81 23 45 67"]),
        ("glucosa 998 123 45 67", ["998 123 45 67"]),
        ("glucosa 55 1234 5678", ["55 1234 5678"]),
        # The values are left and the numbers after them found.
        ("FC 91 88 90 84 73 cel 55 12 34 56 78", ["55 12 34 56 78"]),
        ("FC 91 88 90 84 73 mi cel 81 111 85 114", ["81 111 85 114"]),
        ("FC 91 88 90 84 73 y 55 1234 5678", ["55 1234 5678"]),
    ],
)
def test_phones_that_look_like_values_are_still_found(text: str, phones: list[str]) -> None:
    assert found(f"Buenas tardes doctora, {text}. Gracias") == phones


# --- folios written with the international prefix -------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # Seeds 2034 and 2045 of make_phi_corpus.py: 00 64… (New Zealand) and 09 500…
        # (the Falklands: phonenumbers reads 09 as Mexico's international prefix too).
        "El folio 0064867038 lo tengo",
        "EL FOLIO 0950048193 CUESTA",
        # Ten digits in one piece: a national number's length, and no Mexican number starts with 0.
        "0064867038",
        # In one piece after a reference word, whatever its length.
        "folio 0014155552671",
        "no. de folio 0012025550123",
        "ref 0034612345678",
    ],
)
def test_a_folio_with_the_international_prefix_is_not_a_phone(text: str) -> None:
    assert found(f"Buenas tardes, {text}. Gracias") == []


@pytest.mark.parametrize(
    ("text", "phones"),
    [
        ("tel 0064867038", ["0064867038"]),
        ("whatsapp 0064867038", ["0064867038"]),
        ("001 415 555 2671", ["001 415 555 2671"]),
        ("0014155552671", ["0014155552671"]),
        ("00 52 55 1234 5678", ["00 52 55 1234 5678"]),
        ("0052 55 1234 5678", ["0052 55 1234 5678"]),
        ("00525512345678", ["00525512345678"]),
        ("folio 00525512345678", ["00525512345678"]),  # a Mexican number: never a folio here
        ("folio 00 34 612 345 678", ["00 34 612 345 678"]),  # grouped: the matcher's call
    ],
)
def test_numbers_dialled_abroad_are_still_found(text: str, phones: list[str]) -> None:
    assert found(f"Buenas tardes, {text}. Gracias") == phones


# --- the generators and the cost -------------------------------------------------------------


def _messages_with_a_phone(kind: str, seed: int) -> int:
    return sum(
        any(detection.category == "TELEFONO" for detection in find(text, "MX"))
        for text in messages(kind, seed, 1_000)
    )


def test_heart_rate_and_lab_value_messages_are_left_alone() -> None:
    # benchmarks/phi_lookalikes.py; before the context rules, 41% of the heart-rate
    # messages and 5% of the lab-value ones had a "phone number" (seed 7, 2,000 each).
    assert _messages_with_a_phone("heart_rates", 12) == 0
    assert _messages_with_a_phone("lab_values", 12) <= 5


def test_the_context_rules_keep_matching_linear() -> None:
    # Every rule reads a bounded slice around one number, however many numbers a message
    # holds: 4,000 labelled heart-rate lists, folios or lists before a unit (70,000+
    # characters; most of the time is the matcher's, as before the rules).
    rng = random.Random(5)
    for unit in ("FC {} . ", "folio 00{} ", "{} lpm, ", "FC " + "de la " * 40 + "{} "):
        values = [" ".join(str(rng.randint(60, 99)) for _ in range(5)) for _ in range(4_000)]
        if unit.startswith("folio"):
            values = [f"{rng.randint(0, 99_999_999):08d}" for _ in range(4_000)]
        text = "".join(unit.format(value) for value in values)
        started = time.process_time()
        find(text, "MX")
        assert time.process_time() - started < 5
    # A long run of values after one label: the label reaches only the first ones.
    started = time.process_time()
    find("FC " + "91 88 90 84 73 " * 4_000, "MX")
    assert time.process_time() - started < 5

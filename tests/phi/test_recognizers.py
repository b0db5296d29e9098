"""The recognisers on their own: what they find, what they leave, how overlaps resolve.

Pure functions: no database. The encode_text round trips are in test_service.py and the
corpus in test_corpus.py.
"""

from __future__ import annotations

import itertools
import random
import time

import pytest
from django.test import override_settings
from stdnum import luhn
from stdnum.mx import curp, rfc

from nexus_workflows.conf import app_settings
from nexus_workflows.phi import find_spans, normalize
from nexus_workflows.phi.recognizers import (
    CATEGORY_ORDER,
    Detection,
    canonical_email,
    canonical_phone,
    find,
    resolve,
    shadow,
)

# Pure Python: bin/test runs it once per Django line.
pytestmark = pytest.mark.database_independent


def found(text: str) -> list[tuple[str, str]]:
    """(surface, category) of every span encode_text would replace."""
    return [(text[start:end], category) for start, end, category in find_spans(text)]


def values(text: str) -> set[str]:
    return {detection.value for detection in find(text, app_settings.PHI_DEFAULT_REGION)}


def test_a_detections_repr_holds_no_plaintext() -> None:
    # A repr lands in tracebacks (locals), debuggers and log lines.
    (detection,) = find("mi cel es 55 1234 5678", app_settings.PHI_DEFAULT_REGION)
    assert (detection.category, detection.value) == ("TELEFONO", "+525512345678")
    assert "5512345678" not in repr(detection)
    assert "TELEFONO" in repr(detection)


# --- the issue's table ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("La receta dice 044 55 1234 5678", [("044 55 1234 5678", "TELEFONO")]),
        ("whatsapp 1 55 1234 5678", [("1 55 1234 5678", "TELEFONO")]),
        ("mi correo es maria arroba gmail punto com", [("maria arroba gmail punto com", "EMAIL")]),
        (
            "CURP LOMA800101MDFPRR09 y RFC LOMA800101AB1",
            [("LOMA800101MDFPRR09", "ID"), ("LOMA800101AB1", "ID")],
        ),
    ],
)
def test_the_issues_examples_are_found(text: str, expected: list[tuple[str, str]]) -> None:
    assert found(text) == expected


def fullwidth(digits: str) -> str:
    return "".join(chr(0xFF10 + int(char)) if char.isdigit() else char for char in digits)


# --- phones --------------------------------------------------------------------------------

CDMX_SPELLINGS = [
    "5512345678", "55 1234 5678", "55-1234-5678", "(55) 1234-5678", "(55)1234-5678", "55.1234.5678",
    "551 234 5678", "55 12 34 56 78", "55-12-34-56-78", "5 5 1 2 3 4 5 6 7 8",
    "+52 55 1234 5678", "+525512345678", "52 55 1234 5678", "525512345678", "+52 (55) 1234 5678",
    "+52 1 55 1234 5678", "+5215512345678", "521 55 1234 5678", "5215512345678", "00 52 55 1234 5678",
    "044 55 1234 5678", "045 55 1234 5678", "044-55-1234-5678", "01 55 1234 5678", "01 (55) 1234 5678",
    "1 55 1234 5678", "15512345678",
    "55\u00a01234\u00a05678", "55\u202f1234\u202f5678", fullwidth("5512345678"), fullwidth("55 1234 5678"),
    "\u0665\u0665\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668",  # Arabic-Indic digits
    "55\u20131234\u20135678",  # en dashes
]  # fmt: skip


@pytest.mark.parametrize("spelling", CDMX_SPELLINGS)
def test_every_spelling_of_a_mexican_number_is_found_whole_with_one_value(spelling: str) -> None:
    text = f"Hola, mi número es {spelling}, llámeme después de las 5."
    assert found(text) == [(spelling, "TELEFONO")]
    assert values(text) == {"+525512345678"}
    # encode() of the spelling gives the same value, so one token per number.
    assert normalize(spelling, "TELEFONO") == "+525512345678"


@pytest.mark.parametrize(
    ("spelling", "e164"),
    [
        ("222 123 4567", "+522221234567"),
        ("(222) 123-45-67", "+522221234567"),
        ("998.123.4567", "+529981234567"),
        ("045 (998) 123 4567", "+529981234567"),
        ("+1 (415) 555-2671", "+14155552671"),
        ("+1-415-555-2671", "+14155552671"),
        ("+34 612 345 678", "+34612345678"),
        ("+44 20 7946 0958", "+442079460958"),
        ("+57 321 1234567", "+573211234567"),
        ("001 415 555 2671", "+14155552671"),
    ],
)
def test_other_mexican_areas_and_numbers_abroad(spelling: str, e164: str) -> None:
    text = f"tel {spelling} gracias"
    assert found(text) == [(spelling, "TELEFONO")]
    assert values(text) == {e164}


@pytest.mark.parametrize(
    ("text", "phone"),
    [
        ("cel5512345678", "5512345678"),
        ("el 12/05/2024 55 1234 5678", "55 1234 5678"),
        ("nací en 1985 5512345678", "5512345678"),
        ("5512345678. 3 tabletas", "5512345678"),
        ("llamar 55 1234 5678 10:30", "55 1234 5678"),
        ("(55 1234 5678)", "55 1234 5678"),
        ("tel:+52 55 1234 5678;", "+52 55 1234 5678"),
        ("el de mi mamá (044 998 5857314) y", "044 998 5857314"),
    ],
)
def test_a_number_next_to_other_numbers_is_found_alone(text: str, phone: str) -> None:
    assert found(text) == [(phone, "TELEFONO")]


def test_two_numbers_in_one_line() -> None:
    text = "marque al 55 1234 5678 / 33 8765 4321 o al 044 81 2345 6789"
    assert found(text) == [
        ("55 1234 5678", "TELEFONO"),
        ("33 8765 4321", "TELEFONO"),
        ("044 81 2345 6789", "TELEFONO"),
    ]


@pytest.mark.parametrize(
    ("text", "phones"),
    [
        # Only a space between them: every number is found, not just the run's last one.
        ("mis tels 55 1234 5678 33 3616 1234", ["55 1234 5678", "33 3616 1234"]),
        ("55 1234 5678 55 8765 4321 55 1111 2222", ["55 1234 5678", "55 8765 4321", "55 1111 2222"]),
        # In pairs: two whole numbers, not a middle stretch that leaves digits of both.
        ("cel 55 12 34 56 78 33 36 16 12 34", ["55 12 34 56 78", "33 36 16 12 34"]),
        # After a list of values, more than three groups into the run.
        ("glucosas 98 102 95 110 55 1234 5678", ["55 1234 5678"]),
        # A slash between them, or a link to one: the slash rule is for fractions and
        # dates, whose groups are short. Both numbers went to the LLM in clear before.
        ("tel 5512345678/5587654321", ["5512345678", "5587654321"]),
        ("escríbeme https://wa.me/5215512345678?text=hola", ["5215512345678"]),
        ("wa.me/+525512345678", ["+525512345678"]),
        # The short group next to a slash is still the date's: the number is found alone.
        ("cita 12/05/2024 5512345678", ["5512345678"]),
        ("1/2 tableta, tel 1/5512345678", ["5512345678"]),
        # A word glued to its end that is no unit: the number is whole. Before, any letter
        # after it dropped the last group as if it were "110mg", and the number went in clear.
        ("tel 5512345678hola", ["5512345678"]),
        ("mi cel 55 1234 5678gracias", ["55 1234 5678"]),
        ("5512345678ext12", ["5512345678"]),
        ("55-1234-5678Ana", ["55-1234-5678"]),
        # A unit glued to the value after it is still the value's.
        ("55 1234 5678 glucosas 98 102 95 110mg", ["55 1234 5678"]),
    ],
)
def test_numbers_written_one_after_another_are_each_found(text: str, phones: list[str]) -> None:
    assert found(text) == [(phone, "TELEFONO") for phone in phones]


@pytest.mark.parametrize(
    ("text", "phones"),
    [
        # Grouped numbers around a slash: the groups next to it are short, like a fraction's
        # or a date's, and both numbers went to the LLM in clear (one, when the other side
        # was a single group).
        ("55-1234-5678/55-8765-4321", ["55-1234-5678", "55-8765-4321"]),
        ("55 1234 5678/55 8765 4321", ["55 1234 5678", "55 8765 4321"]),
        ("(55) 1234-5678/(55) 8765-4321", ["(55) 1234-5678", "(55) 8765-4321"]),
        ("+52 55 1234 5678/ +52 55 8765 4321", ["+52 55 1234 5678", "+52 55 8765 4321"]),
        ("+52(55)1234-5678/+52(55)8765-4321", ["+52(55)1234-5678", "+52(55)8765-4321"]),
        ("+52 1 55 1234 5678/+52 1 55 8765 4321", ["+52 1 55 1234 5678", "+52 1 55 8765 4321"]),
        ("044 55 1234 5678/044 55 8765 4321", ["044 55 1234 5678", "044 55 8765 4321"]),
        ("55.1234.5678/55.8765.4321", ["55.1234.5678", "55.8765.4321"]),
        ("55 12 34 56 78/55 87 65 43 21", ["55 12 34 56 78", "55 87 65 43 21"]),
        ("222 123 4567/222 765 4321", ["222 123 4567", "222 765 4321"]),
        ("+1 (415) 555-2671/+1 (415) 555-2672", ["+1 (415) 555-2671", "+1 (415) 555-2672"]),
        ("55 1234 5678 /55 8765 4321", ["55 1234 5678", "55 8765 4321"]),
        ("55-1234-5678//55-8765-4321", ["55-1234-5678", "55-8765-4321"]),
        ("5512345678/55 8765 4321", ["5512345678", "55 8765 4321"]),
        ("tel 55 1234 5678/ cel 55 8765 4321", ["55 1234 5678", "55 8765 4321"]),
        ("55 1234 5678 (casa)/55 8765 4321 (cel)", ["55 1234 5678", "55 8765 4321"]),
        # Dates and a blood pressure around them keep their digits.
        (
            "TA 120/80, cita 12/05/2024 55-1234-5678/55-8765-4321 o el 19/05/2024",
            ["55-1234-5678", "55-8765-4321"],
        ),
        # A number's last group before a slash is its own: a fraction's, a day's or a
        # dose's group there has fewer than four digits. And after a word and a slash, the
        # first group is the number's.
        ("Tel./Fax: 55-1234-5678/79", ["55-1234-5678"]),
        ("55 1234 5678/79", ["55 1234 5678"]),
        ("55-1234-5678/cel", ["55-1234-5678"]),
        ("55 1234 5678/ext 123", ["55 1234 5678"]),
        ("cel/55 1234 5678", ["55 1234 5678"]),
        ("(casa)/55-8765-4321", ["55-8765-4321"]),
        # Glued together by a conjunction or a dash: each number, not one run of twenty
        # digits (or a number and a "code" glued to a letter).
        ("5512345678ó5587654321", ["5512345678", "5587654321"]),
        ("5512345678y5587654321", ["5512345678", "5587654321"]),
        ("55-1234-5678y55-8765-4321", ["55-1234-5678", "55-8765-4321"]),
        ("55 1234 5678 y/o55 8765 4321", ["55 1234 5678", "55 8765 4321"]),
        ("5512345678-5587654321", ["5512345678", "5587654321"]),
    ],
)
def test_numbers_around_a_slash_or_glued_together_are_each_found(text: str, phones: list[str]) -> None:
    assert found(f"mis teléfonos {text} gracias") == [(phone, "TELEFONO") for phone in phones]


def test_numbers_around_a_slash_get_their_own_values() -> None:
    assert values("55-1234-5678/55-8765-4321") == {"+525512345678", "+525587654321"}
    assert values("(55) 1234-5678/(55) 8765-4321") == {"+525512345678", "+525587654321"}


@pytest.mark.parametrize(
    ("text", "phones"),
    [
        ("TA 120/80 55 1234 5678", ["55 1234 5678"]),
        ("55 1234 5678 1/2 tableta", ["55 1234 5678"]),
        ("55-1234-5678 3/4", ["55-1234-5678"]),
        ("55 1234 5678 2/día", ["55 1234 5678"]),
        ("55 1234 5678 1-2/día", ["55 1234 5678"]),
        ("55 1234 5678 5/325 mg", ["55 1234 5678"]),
        ("55 12 34 56 78 12/05/2024", ["55 12 34 56 78"]),
        ("55 1234 5678 2024/05/12", ["55 1234 5678"]),
        ("el 2024/05/12 55 1234 5678", ["55 1234 5678"]),
        ("glucosa 98/102/95 55 1234 5678", ["55 1234 5678"]),
        # A fraction between two numbers: neither number takes its digits.
        ("55 12 34 56 78 1/2 55 87 65 43 21", ["55 12 34 56 78", "55 87 65 43 21"]),
        ("55 1234 5678 120/80 55 8765 4321", ["55 1234 5678", "55 8765 4321"]),
        # A slash with a word after it is no slash between two numbers: the heart rates'
        # last group stays the "/min"'s, and the five of them are no number.
        ("frecuencias 91 88 90 84 73/min, tel 55 1234 5678", ["55 1234 5678"]),
        ("código A5512345678y5587654321 o 55 1234 5678", ["55 1234 5678"]),
    ],
)
def test_a_fraction_or_date_next_to_a_number_keeps_its_digits(text: str, phones: list[str]) -> None:
    # Guards: these held before the slash rules changed and must still hold.
    assert found(text) == [(phone, "TELEFONO") for phone in phones]


def test_two_halves_of_a_folio_joined_by_a_dash_are_not_a_number_abroad() -> None:
    # Read as one window, "00490734-14064392" was 00 (the international prefix) and a
    # valid German number. A dash between two groups of seven digits or more now parts
    # them, and neither half is a number.
    assert found("folio 00490734-14064392 ok") == []
    assert found("folio 09492732-81504598 ok") == []


NOT_IDENTIFIERS = [
    # dates and times
    "12/05/2024", "12-05-2024", "12.05.2024", "2024-05-12", "12 05 2024", "12 de mayo de 2024",
    "cita 12-05-2024 10:30", "2024-05-12 10:30", "12/05/2024 10:30", "10:30", "16.45 hrs", "8 am",
    "de 9 a 14 hrs", "del 5 al 12 de junio de 2024",
    # amounts
    "$1,250.00", "$ 350", "1500 pesos", "MXN 2,300", "$12 500", "$ 1 250 000", "$25,000,000.00",
    "$ 25 000 000.00", "1 250 000 pesos",
    # doses, vitals and lab values
    "500 mg cada 8 horas", "1 tableta cada 12 hrs por 7 días", "10 UI", "0.5 ml", "20 gotas", "1/2 tableta",
    "120/80", "presión 135/90 mmHg", "glucosa 110 mg/dl", "HbA1c 7.2%", "plaquetas 250 000",
    "leucocitos 11 500", "glucosas 98 102 95 110", "glucosas 105 110 98 120 130", "glucosas 133 154 115 99",
    "peso 72.5 kg", "glucosas 98 102 95 110mg", "dosis 1 500 250mg", "tomar 2 250 500mgs",
    "talla 1.65 m", "temperatura 38.5", "saturación 94%", "semana 32 de embarazo",
    # places, years, folios
    "C.P. 06600", "CP 44100", "habitación 305", "cama 12", "consultorio 4B", "ext. 2345", "extensión 112",
    "desde 2019", "en 1998", "folio 483920", "orden 2024-000123", "pedido #A-55123", "receta No. 0012345",
    "folio 1234567890", "folio 0987654321", "guía 71234567891", "lote B2405X", "ticket 00045821",
    "factura FAC240115001", "clave LOMA800101MXXPRR04", "LOMA800101", "123456789012",
    # words that spell e-mails elsewhere
    "compré una arroba de naranjas", "a las 8 en punto", "desde mi punto de vista", "@clinica_salud",
    "maria@gmail", "nos vemos at home",
    # next to a slash or glued: fractions, dates, ranges, lab values and folios, also where
    # seven digits or more stand on both sides of the slash
    "5/325 mg", "1-2/día", "glucosa 98/102/95", "glucosa 98/102/95/110/120/130/140", "2024/05/12",
    "2017/3/18", "ciclo 2023/2024", "12/05/2024-19/05/2024", "2024-05-12/2024-06-12",
    "12-05-2024 10/12-06-2024 11", "12/05/2024 10:30/13/05/2024 11:00", "20240512/20240612",
    "plaquetas 250 000/mm3", "1 250 000/2 500 000", "glucosas 98 102 95 110/100 98 97 120",
    "glucosas 98 102 95 110/120", "TA 120/80, 130/85, 125/80", "dosis 1500/2000 mg", "1000-2000/500-600",
    "c/8 hrs", "1/2/3 tabletas", "ext. 2345/2346", "CP 06600/06700", "folio 483920/483921",
    "orden 2024-000123/2024-000124", "folio 123-456/2024", "folio 20240512-20240612",
    "lote 1234567-1234567", "guía 7123456.7891011", "código A5512345678y5587654321",
    # a date's two-digit year before values in pairs (with it, a valid number in pairs)
    "glucosas del 12/05/24 98 95 92 88", "TA del 12/05/24 90 85 88 92",
    # five heart rates (valid as a number in pairs) before "/min" or a diastolic value
    "frecuencias 91 88 90 84 73/min", "TA 91 88 90 84 73/60 mmHg",
    # a year written first after a grouped folio: its group of four is the date's
    "folio 395-621 2017/3/18", "exp. 222 123 2024/05/12", "folio 55 1234 2024/5/12",
]  # fmt: skip


@pytest.mark.parametrize("text", NOT_IDENTIFIERS)
def test_nothing_else_is_touched(text: str) -> None:
    message = f"Buenas tardes, {text}. Gracias"
    assert found(message) == []


def test_grouping_that_no_phone_number_has_is_not_a_phone() -> None:
    # Valid Mexican numbers by their digits, but grouped as lists of values are.
    assert found("glucosas 98 102 95 110") == []
    assert found("98 102 95 110") == []
    assert found("981 029 5110") == [("981 029 5110", "TELEFONO")]


@override_settings(NEXUS_WORKFLOWS={"PHI_DEFAULT_REGION": "US"})
def test_mexican_prefixes_apply_only_when_the_region_is_mexico() -> None:
    assert found("call 415 555 2671") == [("415 555 2671", "TELEFONO")]
    assert values("call 415 555 2671") == {"+14155552671"}
    # 044 means nothing there; 551 is an area code in New Jersey.
    assert found("044 55 1234 5678") == [("55 1234 5678", "TELEFONO")]
    assert values("044 55 1234 5678") == {"+15512345678"}


# --- e-mail addresses ----------------------------------------------------------------------

EMAIL_SPELLINGS = [
    "maria.lopez@gmail.com", "Maria.Lopez@Gmail.COM", "MARIA.LOPEZ@GMAIL.COM",
    "maria punto lopez arroba gmail punto com", "Maria Punto Lopez Arroba Gmail Punto Com",
    "maria.lopez arroba gmail.com", "maria.lopez @ gmail . com", "maria.lopez@ gmail.com",
    "maria.lopez(at)gmail(dot)com", "maria.lopez [at] gmail [dot] com",
    "maria.lopez (arroba) gmail (punto) com", "maria.lopez\uff20gmail.com",  # full-width @
]  # fmt: skip


@pytest.mark.parametrize("spelling", EMAIL_SPELLINGS)
def test_every_spelling_of_an_address_is_found_whole_with_one_value(spelling: str) -> None:
    text = f"mi correo es {spelling} y ahí me manda la receta"
    assert found(text) == [(spelling, "EMAIL")]
    assert values(text) == {"maria.lopez@gmail.com"}
    assert normalize(spelling, "EMAIL") == "maria.lopez@gmail.com"


@pytest.mark.parametrize(
    ("address", "value"),
    [
        ("maria.lopez+citas@example.com.mx", "maria.lopez+citas@example.com.mx"),
        ("jose_85@correo.unam.mx", "jose_85@correo.unam.mx"),
        ("R.Perez@Sub.Dominio.Example.org", "r.perez@sub.dominio.example.org"),
        ("juan guion bajo perez arroba hotmail punto com", "juan_perez@hotmail.com"),
        ("ana guion medio ruiz arroba outlook punto es", "ana-ruiz@outlook.es"),
        ("núñez@correo.mx", "núñez@correo.mx"),
        ("someone@example.museum", "someone@example.museum"),
    ],
)
def test_addresses(address: str, value: str) -> None:
    text = f"correo: {address}."
    assert found(text) == [(address, "EMAIL")]
    assert values(text) == {value}


def test_a_spelled_address_stops_at_its_top_level_domain() -> None:
    text = "maria arroba gmail punto com punto y aparte"
    assert found(text) == [("maria arroba gmail punto com", "EMAIL")]


def test_invalid_addresses_are_not_found() -> None:
    assert found("a..b@example.com") == []
    assert found("maria arroba gmail punto xyz123") == []  # spelled: a known top-level domain


# --- national IDs --------------------------------------------------------------------------


def make_curp(body: str) -> str:
    return body + curp.calc_check_digit(body)


def test_curp_with_or_without_its_check_digit() -> None:
    good = make_curp("HEGG560427MVZRRL0")
    wrong = good[:-1] + str((int(good[-1]) + 1) % 10)
    for value in (good, wrong, good.lower(), "HEGG-560427-MVZRRL0" + good[-1]):
        assert found(f"CURP: {value}") == [(value, "ID")]
    assert values(f"curp {good.lower()}") == {good}


@pytest.mark.parametrize(
    "body",
    [
        "HEGG560427MXXRRL0",  # no such state
        "HEGG561327MVZRRL0",  # month 13
        "HEGG560230MVZRRL0",  # 30 February
        "HEGG560427QVZRRL0",  # sex Q
        "HEGG560427MVZRAL0",  # a vowel where a consonant goes
        "HBGG560427MVZRRL0",  # B is no vowel
    ],
)
def test_a_curp_must_have_its_structure(body: str) -> None:
    assert found(f"CURP {make_curp(body)}") == []


def test_rfc_of_a_person_and_of_a_company() -> None:
    person = "GODE561231GR" + rfc.calc_check_digit("GODE561231GR")
    company = "ABC010101AB" + rfc.calc_check_digit("ABC010101AB")
    assert found(f"mis datos: {person}, empresa {company}") == [(person, "ID"), (company, "ID")]


def test_rfc_check_digit_is_required_unless_rfc_is_said() -> None:
    body = "GODE561231GR"
    wrong = body + ("1" if rfc.calc_check_digit(body) != "1" else "2")
    assert found(f"folio {wrong}") == []
    assert found(f"RFC {wrong}") == [(wrong, "ID")]
    assert found(f"mi rfc es {wrong}") == [(wrong, "ID")]
    # Without homoclave only after "RFC".
    assert found("RFC: GODE561231") == [("GODE561231", "ID")]
    assert found("clave GODE561231") == []


def test_nss_check_digit_is_required_unless_nss_is_said() -> None:
    first10 = "7298760185"
    good = first10 + luhn.calc_check_digit(first10)
    wrong = first10 + str((int(good[-1]) + 1) % 10)
    assert found(f"numero {good}") == [(good, "ID")]
    grouped = f"{good[:2]}-{good[2:4]}-{good[4:6]}-{good[6:10]}-{good[10]}"
    assert found(f"numero {grouped}") == [(grouped, "ID")]
    assert values(f"numero {grouped}") == {good}
    assert found(f"guía {wrong}") == []
    assert found(f"NSS {wrong}") == [(wrong, "ID")]
    assert found(f"mi número de seguro social es {wrong}") == [(wrong, "ID")]
    assert found(f"mi número de seguro soical es {wrong}") == [(wrong, "ID")]  # a typo in the cue
    assert found(f"NSS de mi esposo: {wrong}") == [(wrong, "ID")]


@pytest.mark.parametrize(
    "spelling",
    ["LPMRMR80010109M100", "lpmrmr80010109m100", "LPMRMR 80010109 M100", "GRLPJN85123188H400"],
)
def test_an_ine_voter_key_is_an_id(spelling: str) -> None:
    # The clave de elector of a voting card, the ID patients photograph most.
    text = f"mi clave de elector es {spelling} gracias"
    assert found(text) == [(spelling, "ID")]
    assert values(text) == {spelling.replace(" ", "").upper()}


@pytest.mark.parametrize(
    "text",
    [
        "LPMRMR80023009M100",  # 30 February
        "LPMRMR80010145M100",  # no state 45
        "LPMRMR80010109X100",  # neither H nor M
        "CASAS 80010109 M100",  # five letters
    ],
)
def test_what_only_looks_like_an_ine_voter_key_is_left(text: str) -> None:
    assert found(f"folio {text}") == []


# --- resolution ----------------------------------------------------------------------------


def test_caller_spans_win_then_longest_then_earliest_then_cue_then_category() -> None:
    detections = [
        Detection(0, 10, "TELEFONO", "+525512345678"),
        Detection(0, 10, "ID", "5512345678"),  # same span: ID before TELEFONO
        Detection(5, 30, "EMAIL", "x@example.com"),  # longest
        Detection(32, 40, "TELEFONO", "+1", cued=True),
        Detection(32, 40, "ID", "A"),  # same span: the cued one wins over category order
        Detection(41, 45, "ID", "B"),
        Detection(43, 47, "ID", "C"),  # later and as long: the earlier wins
    ]
    caller = [(44, 50, "PERSONA")]
    for order in itertools.permutations(detections):
        assert resolve(caller, order) == [(5, 30, "EMAIL"), (32, 40, "TELEFONO"), (44, 50, "PERSONA")]
    assert resolve([], detections[:2]) == [(0, 10, "ID")]
    assert resolve([], detections[5:]) == [(41, 45, "ID")]


def test_resolution_is_the_one_rule_on_random_overlaps() -> None:
    # The rule as first written (each candidate against every span chosen), as reference.
    def reference(caller: list[tuple[int, int, str]], found: list[Detection]) -> list[tuple[int, int, str]]:
        chosen = list(caller)
        ranked = sorted(
            set(found),
            key=lambda d: (d.start - d.end, d.start, not d.cued, CATEGORY_ORDER.index(d.category), d.value),
        )
        for d in ranked:
            if not any(d.start < end and start < d.end for start, end, _ in chosen):
                chosen.append((d.start, d.end, d.category))
        return sorted(chosen)

    generator = random.Random(7)
    categories = ("EMAIL", "ID", "TELEFONO")
    for _ in range(500):
        caller = []
        position = 0
        for _ in range(generator.randrange(3)):
            position += generator.randrange(1, 20)
            caller.append((position, position + generator.randrange(1, 6), "PERSONA"))
            position = caller[-1][1]
        found = []
        for _ in range(generator.randrange(12)):
            start = generator.randrange(60)
            found.append(
                Detection(
                    start,
                    start + generator.randrange(1, 15),
                    generator.choice(categories),
                    str(generator.randrange(3)),
                    generator.random() < 0.3,
                )
            )
        assert resolve(caller, found) == reference(caller, found)


def test_resolving_many_detections_is_not_quadratic() -> None:
    # A long message full of addresses: checking each against every chosen span took
    # about a second for 8,000 and grew with the square (a minute for 60,000).
    detections = [Detection(20 * n, 20 * n + 15, "EMAIL", f"p{n}@example.com") for n in range(60_000)]
    started = time.process_time()
    chosen = resolve([(5, 10, "PERSONA")], detections)
    assert time.process_time() - started < 5
    assert len(chosen) == 60_000
    assert chosen[:2] == [(5, 10, "PERSONA"), (20, 35, "EMAIL")]


@pytest.mark.parametrize(
    "text",
    [
        "escribe a a@" + "b." * 10_000 + " gracias",  # written: no label is a top-level domain
        "a arroba " + "b punto " * 4_000 + "gracias",  # spelled: none is a known one
    ],
)
def test_an_address_of_thousands_of_labels_is_not_quadratic(text: str) -> None:
    # Dropping trailing labels one at a time re-scanned the whole candidate each time: a
    # 20,000-character message took about half a minute (7 s at 10,000), and any patient
    # (or anyone) can send one.
    started = time.process_time()
    assert found(text) == []
    assert time.process_time() - started < 3


def test_a_long_run_of_numbers_is_not_quadratic() -> None:
    # Pasted lab values make one run of digits and spaces. Every group's windows walked
    # every earlier group of the run first: 168,000 characters took about 16 s, growing
    # with the square of the length.
    text = "98 102 95 110 " * 12_000
    started = time.process_time()
    assert found(text) == []
    assert time.process_time() - started < 5
    # Numbers in such a run are still found, near its start, middle and end.
    labs = "98 102 95 110 " * 1_000
    spans = found(f"{labs}55 1234 5678 {labs}33 3616 1234 {labs}")
    assert spans == [("55 1234 5678", "TELEFONO"), ("33 3616 1234", "TELEFONO")]


def test_many_numbers_around_slashes_are_found_in_linear_time() -> None:
    # Each run is compared with its neighbours once: a pasted list of 10,000 numbers joined
    # by slashes (130,000 characters) takes well under a second. These bounds are on this
    # process's CPU time: CI's two streams at once stretched the wall clock past 5 s.
    numbers = [f"55-{1000 + n % 9000:04d}-{(n * 7919) % 10_000:04d}" for n in range(10_000)]
    started = time.process_time()
    spans = found("/".join(numbers))
    assert time.process_time() - started < 5
    assert [surface for surface, _ in spans] == numbers
    # Numbers in one piece joined by dashes and dots: one run of 100,000 digits, split at
    # each joint, and no window crosses one.
    numbers = [number.replace("-", "") for number in numbers]
    joined = "".join(f"{number}{'-.'[n % 2]}" for n, number in enumerate(numbers))
    started = time.process_time()
    spans = found(joined)
    assert time.process_time() - started < 5
    assert [surface for surface, _ in spans] == numbers


def test_an_address_of_many_labels_still_stops_at_its_top_level_domain() -> None:
    address = "maria@" + "b." * 40 + "com"
    assert found(f"correo {address}.x.y listo") == [(address, "EMAIL")]
    spelled = "maria arroba " + "b punto " * 40 + "com"
    assert found(f"correo {spelled} punto y aparte") == [(spelled, "EMAIL")]


def test_digits_inside_an_address_are_not_a_phone() -> None:
    assert found("escriba a a5512345678@x.com") == [("a5512345678@x.com", "EMAIL")]
    assert found("escriba a 5512345678@x.com") == [("5512345678@x.com", "EMAIL")]


def test_spans_never_cross_a_line_break() -> None:
    assert found("55 1234\n5678") == []
    assert found("maria arroba\ngmail punto com") == []


# --- helpers -------------------------------------------------------------------------------


def test_shadow_keeps_offsets() -> None:
    text = fullwidth("55") + "\u00a0" + fullwidth("1234") + "\uff0d" + fullwidth("5678") + " 🙏 \uff0b52"
    assert shadow(text) == "55 1234-5678 🙏 +52"
    assert len(shadow(text)) == len(text)


def test_canonical_forms_need_the_whole_text() -> None:
    assert canonical_phone(" 044 55 1234 5678 ", "MX") == "+525512345678"
    assert canonical_phone("tel 55 1234 5678", "MX") is None
    assert canonical_email("maria arroba gmail punto com") == "maria@gmail.com"
    assert canonical_email("correo maria@gmail.com") is None

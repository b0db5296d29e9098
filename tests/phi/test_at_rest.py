"""No plaintext of any encoded value is stored: dump every table and search it."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from nexus_workflows.phi import decode, encode, encode_text, normalize
from nexus_workflows.phi.normalization import surface_form

pytestmark = pytest.mark.django_db(transaction=True)

ENCODED = [
    ("María Guadalupe López Hernández", "PERSONA"),
    ("maria guadalupe lopez hernandez", "PERSONA"),
    ("MARÍA GUADALUPE LÓPEZ HERNÁNDEZ", "PERSONA"),
    ("Jesús Ángel Núñez Ibarra", "PERSONA"),
    ("(55) 8765-4321", "TELEFONO"),
    ("+52 55 2468 1357", "TELEFONO"),
    ("Guadalupe.Hernandez@Correo-Ejemplo.mx", "EMAIL"),
    ("HEGL-800101-MDFRRS09", "ID"),
]
MESSAGE = "Soy Rosalinda Quetzalli, mi cel es 33 1357 9246 y mi correo rosalinda.q@ejemplo-salud.mx"


def full_dump() -> str:
    """Every column of every table, as text, plus dumpdata for good measure."""
    parts: list[str] = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            parts.extend(repr(row) for row in cursor.fetchall())
    out = StringIO()
    call_command("dumpdata", exclude=["django_rq"], stdout=out)  # django_rq's model has no table
    parts.append(out.getvalue())
    parts.append(json.dumps(json.loads(out.getvalue()), ensure_ascii=False))
    return "\n".join(parts)


def forms(value: str, category: str) -> set[str]:
    """The value as given, as it would be surfaced, and normalised, in a few cases."""
    found = {value, surface_form(value), normalize(value, category)}
    found |= {form.lower() for form in found} | {form.upper() for form in found}
    if category == "TELEFONO":
        digits = "".join(char for char in value if char.isdigit())
        found |= {digits, digits[-8:], normalize(value, category).lstrip("+")}
    return found


def test_no_plaintext_at_rest() -> None:
    code = "conversation-at-rest"
    tokens = [encode(code, value, category) for value, category in ENCODED]
    start = MESSAGE.index("Rosalinda")
    encoded_message = encode_text(
        code, MESSAGE, spans=[(start, start + len("Rosalinda Quetzalli"), "PERSONA")]
    )
    assert decode(code, encoded_message) == MESSAGE

    dump = full_dump()
    # The dump does hold the tables: the code and the tokens are there in clear.
    assert code in dump
    for token in tokens:
        assert token in dump

    searched = {form for value, category in ENCODED for form in forms(value, category)}
    searched |= forms("Rosalinda Quetzalli", "PERSONA")
    searched |= forms("33 1357 9246", "TELEFONO")
    searched |= forms("rosalinda.q@ejemplo-salud.mx", "EMAIL")
    searched |= {"Rosalinda", "Quetzalli", "Guadalupe", "Hernández", "Hernandez", "Núñez", "Nunez", "HEGL"}
    lowered = dump.lower()
    leaked = sorted(form for form in searched if form.lower() in lowered)
    assert leaked == []

"""A separate process for the concurrency test: encode the shared value set into one code.

    DJANGO_SETTINGS_MODULE=tests.settings DATABASE_URL=... python -m tests.phi.encode_worker CODE INDEX

Prints ``ready`` once connected, waits for a line on stdin (so that every process
starts at once), encodes every value in its own order and spelling, and prints the
answers as one JSON object ``{value index: token}``.
"""

from __future__ import annotations

import json
import random
import sys
import unicodedata

FIRST_NAMES = [
    "María", "José", "Jesús", "Sofía", "Ramón", "Inés", "Andrés", "Lucía", "Martín", "Raúl",
    "Mónica", "Héctor", "Verónica", "Rubén", "Begoña", "Adrián", "Beatriz", "Joaquín", "Iñaki", "Zoé",
    "Ángel", "Nicolás", "Valentín", "Daniela", "Tomás",
]  # fmt: skip
SURNAMES = ["López", "Núñez", "Pérez", "Gómez", "Ibarra"]


def _plain(text: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def values() -> list[tuple[str, list[str]]]:
    """500 values: (category, spellings), the richest spelling first."""
    result: list[tuple[str, list[str]]] = []
    for first in FIRST_NAMES:
        for surname in SURNAMES:
            name = f"{first} {surname}"
            result.append(
                ("PERSONA", [name, _plain(name).lower(), name.upper(), f"  {_plain(name).upper()} "])
            )
    for n in range(125):
        local = f"{1000 + n:04d} 5678"
        compact = local.replace(" ", "")
        result.append(
            (
                "TELEFONO",
                [f"+52 55 {local}", f"55 {local}", f"(55) {compact[:4]}-{compact[4:]}", f"55{compact}"],
            )
        )
    for n in range(125):
        email = f"Paciente.{n}@Clinica-Ejemplo.mx"
        result.append(("EMAIL", [email, email.lower(), email.upper(), f" {email.lower()} "]))
    for n in range(125):
        result.append(("ID", [f"Abc-{n:06d}", f"ABC{n:06d}", f"abc {n:06d}", f"ABC-{n:06d}"]))
    return result


def main(code: str, index: int) -> None:
    import django

    django.setup()
    from django.db import connection

    from nexus_workflows.phi import encode

    connection.ensure_connection()
    print("ready", flush=True)
    sys.stdin.readline()
    table = values()
    order = list(range(len(table)))
    random.Random(index).shuffle(order)
    answers: dict[int, str] = {}
    for position in order:
        category, spellings = table[position]
        answers[position] = encode(code, spellings[(index + position) % len(spellings)], category)
    print(json.dumps(answers), flush=True)
    connection.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

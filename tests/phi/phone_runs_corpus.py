"""Makes tests/phi/data/phone_runs.json: the phone recogniser's answers on a fixed corpus.

    .venv/bin/python tests/phi/phone_runs_corpus.py PATH/TO/recognizers.py

Run once, against a copy of ``nexus_workflows/phi/recognizers.py`` from before the phone
recogniser was made fast on long runs of digits, and checked in: test_phone_runs.py then
asserts that the current recogniser returns exactly what that one did. The inputs are
seeded and synthetic (random digits and separators, cue words, the PHI corpus, the
look-alike generators and the strings of the recogniser tests): no patient data.

Each entry: ``[text, region, [[start, end, value, cued], …]]``, every ``find_phones``
detection in order.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).resolve().parent / "data" / "phone_runs.json"

DIGITS = "0123456789"
SEPARATORS = [" ", " ", " ", "  ", "\t", ".", "-", "(", ")", ". ", " (", ") ", " - ", "   ", ".-"]
NOISE = [
    "/", ":", ",", "%", "$", "\n", "+", "+ ", "#", "x", "ext", "a", "y", "o", "ó", "mg", "lpm", "hola",
    "h", "kg", "años", "am", " y/o ", "\u00a0", "\uff0b", "\u2013", "\uff15", "\u0663", "é", "🙏",
]  # fmt: skip
CUES = [
    "tel", "tel.", "Tel: ", "cel", "cel.", "celular", "phone", "llame al", "llámame al", "whatsapp",
    "wa.me/", "mi número es", "número", "no. ", "lada", "contacto", "fijo", "FC", "glucosa",
    "folio", "referencia", "NSS", "CURP", "TA", "presión", "el ", "de ", "del paciente: ",
]  # fmt: skip
# Phone shapes, "9" standing for any digit.
SHAPES = [
    "99 9999 9999", "999 999 9999", "9999999999", "(99) 9999-9999", "(999) 999-9999", "99-99-99-99-99",
    "99 99 99 99 99", "+52 99 9999 9999", "+52 1 99 9999 9999", "+521 99 9999 9999", "52 99 9999 9999",
    "044 99 9999 9999", "045 999 999 9999", "01 99 9999 9999", "1 99 9999 9999", "01 800 999 9999",
    "+1 999 999 9999", "+34 999 99 99 99", "0052 1 99 9999 9999", "99.9999.9999", "999.999.9999",
    "9999-9999", "99 9999 999", "+ 52 99 9999 9999", "(+52) 99 9999 9999", "99 9999 9999 ext 99",
]  # fmt: skip
# Numbers that are valid, so that hits are frequent (synthetic, from the library's examples),
# short ones of small countries among them (seven digits with the country code).
VALID = [
    "55 1234 5678", "33 3616 1234", "998 123 4567", "81 8123 4567", "+1 212 555 0123", "+683 7012",
    "+690 3101", "+290 8999", "+6837012", "(+690) 3101", "+247 62889", "+682 21 234", "+687 20.12.34",
    "+95 1 234 567", "00683 7012", "+ 683 7012",
]  # fmt: skip


# What stands between two numbers: a list, a slash, a conjunction, a year, a date.
JOINERS = [" ", " y ", "/", " / ", ", ", "\n", "ó", " o ", " ", "-", " 2024 ", " 12/05 "]


def _digits(rng: random.Random, count: int) -> str:
    return "".join(rng.choice(DIGITS) for _ in range(count))


def _shape(rng: random.Random) -> str:
    return "".join(rng.choice(DIGITS) if char == "9" else char for char in rng.choice(SHAPES))


def mixed(rng: random.Random) -> str:
    """Digits, separators, noise and cue words in any order."""
    pieces: list[str] = []
    for _ in range(rng.randint(1, rng.choice([8, 30, 120]))):
        kind = rng.random()
        if kind < 0.4:
            pieces.append(_digits(rng, rng.choice([1, 1, 2, 2, 3, 4, 4, 5, 7, 10, 12])))
        elif kind < 0.7:
            pieces.append(rng.choice(SEPARATORS))
        elif kind < 0.85:
            pieces.append(rng.choice(NOISE))
        elif kind < 0.95:
            pieces.append(rng.choice(CUES) + rng.choice(["", " ", ": "]))
        else:
            pieces.append(_shape(rng))
    return "".join(pieces)


def spaced(rng: random.Random) -> str:
    """Single digits (or short groups) joined by one kind of separator, or by any."""
    one = rng.choice(SEPARATORS)
    width = rng.choice([1, 1, 1, 2, 3, 4])
    count = rng.randint(5, rng.choice([15, 40, 200]))
    pieces = [_digits(rng, rng.randint(1, width)) for _ in range(count)]
    joiners = [one if rng.random() < 0.8 else rng.choice(SEPARATORS) for _ in pieces]
    body = "".join(piece + joiner for piece, joiner in zip(pieces, joiners, strict=True)).rstrip()
    before = rng.choice(["", "", rng.choice(CUES) + " ", "$", "+", "("])
    return before + body + rng.choice(["", "", " mg", "/2", ":30", "%"])


def phones(rng: random.Random) -> str:
    """Phone-shaped numbers (random digits, or valid ones) among words and other digits."""
    pieces: list[str] = []
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.3:
            pieces.append(rng.choice(CUES) + " ")
        number = rng.choice(VALID) if rng.random() < 0.3 else _shape(rng)
        pieces.append(number)
        pieces.append(rng.choice(JOINERS))
    return "".join(pieces)


def groups(rng: random.Random) -> str:
    """Groups of one to five digits joined by one separator each: lists, numbers, both."""
    count = rng.randint(3, rng.choice([10, 30, 80]))
    return " ".join(_digits(rng, rng.randint(1, 5)) for _ in range(count))


GENERATORS: dict[str, tuple[Callable[[random.Random], str], int]] = {
    "mixed": (mixed, 1800),
    "spaced": (spaced, 1200),
    "phones": (phones, 900),
    "groups": (groups, 600),
}

# Long texts, at the sizes that cost: a WhatsApp message (4,096 characters) and more.
LONG = {
    "5 ": [4096, 20000],
    "1 2 3 4 5 6 7 8 9 0 ": [4096, 20000],
    "5  ": [4096],
    "5. ": [4096],
    "(5) ": [4096],
    "5\t": [4096],
    "5.": [4096],
    "5-": [4096],
    "55 12 34 56 78 ": [4096],
    "55 1234 5678 ": [4096],
}


def _long(rng: random.Random) -> list[str]:
    texts = [(piece * (size // len(piece) + 1))[:size] for piece, sizes in LONG.items() for size in sizes]
    # Spaced digits with a number, five pairs or a long group at the end or in the middle.
    texts += ["5 " * 2042 + "55 1234 5678", "1 2 3 4 5 6 7 8 9 0 " * 204 + "12 34 56 78 90"]
    texts += ["5 " * 1000 + "1234 " + "5 " * 1000, "5 " * 1000 + "33 36 16 12 34 " + "5 " * 1000]
    for make in (mixed, spaced, groups, phones):
        text = ""
        while len(text) < 4096:
            text += make(rng) + rng.choice([" ", "\n", " ", ""])
        texts.append(text[:4096])
    text = ""
    while len(text) < 4096:
        text += _digits(rng, 1) + rng.choice([" ", "\t", ".", "-", "(", ")", " (", ") ", ". "])
    texts.append(text[:4096])
    return texts


def _test_strings() -> list[str]:
    """The string constants of the recogniser tests that hold a digit."""
    found: list[str] = []
    for name in ("test_recognizers.py", "test_lookalikes.py", "test_inputs.py", "test_corpus.py"):
        tree = ast.parse((Path(__file__).parent / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and any(char.isdigit() for char in value) and len(value) < 5000:
                found.append(value)
    return list(dict.fromkeys(found))


def build() -> list[tuple[str, str]]:
    """(text, region) of every input, in order."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.phi_lookalikes import messages

    rng = random.Random("phone-runs")
    texts: list[str] = []
    for make, count in GENERATORS.values():
        texts.extend(make(rng) for _ in range(count))
    texts.extend(_long(rng))
    corpus = ROOT / "benchmarks" / "data" / "phi_corpus.jsonl"
    texts.extend(json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines())
    for kind in ("bare_heart_rates", "heart_rates", "lab_values"):
        texts.extend(messages(kind, 11, 150))
    texts.extend(_test_strings())
    inputs = [(text, "MX") for text in texts]
    # Other regions take other paths (no Mexican prefixes, no ten-digit rule).
    inputs.extend((text, rng.choice(["US", "ES", "AR"])) for text in texts[:2000:4] if len(text) < 1000)
    return inputs


def _load(path: str) -> Callable[..., list]:
    spec = importlib.util.spec_from_file_location("recognizers_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.find_phones


def main() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()  # the recognisers import nexus_workflows.phi, whose models need it
    find_phones = _load(sys.argv[1])
    entries = []
    for text, region in build():
        found = [[d.start, d.end, d.value, d.cued] for d in find_phones(text, region)]
        entries.append([text, region, found])
    FIXTURE.parent.mkdir(exist_ok=True)
    lines = (json.dumps(entry, separators=(",", ":")) for entry in entries)
    FIXTURE.write_text("[\n" + ",\n".join(lines) + "\n]\n", encoding="ascii")  # lone surrogates too
    hits = sum(bool(found) for _, _, found in entries)
    print(f"{len(entries)} inputs, {hits} with a phone found -> {FIXTURE}")


if __name__ == "__main__":
    main()

"""Recall and false positives of encode_text's recognisers on the PHI corpus, and its speed.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/nw_phi_bench .venv/bin/python benchmarks/phi_recall.py

Reads benchmarks/data/phi_corpus.jsonl (made by benchmarks/make_phi_corpus.py). A span
counts as found when the recognisers return exactly its start, end and category and its
text normalises to the value the generator recorded; every other span they return is a
false positive. Then it times ``encode_text`` of a 500-character message on one core
with the conversation's token map cached (warm), prints the median, and deletes what it
wrote. With no PHI keys in the environment it generates throw-away ones for the run.
Figures only: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ.setdefault("NEXUS_WORKFLOWS_LOG_LEVEL", "WARNING")
if "PHI_HMAC_KEY" not in os.environ and "PHI_ENCRYPTION_KEYS" not in os.environ:
    import secrets

    from cryptography.fernet import Fernet

    os.environ["PHI_HMAC_KEY"] = secrets.token_urlsafe(48)
    os.environ["PHI_ENCRYPTION_KEYS"] = Fernet.generate_key().decode()

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from nexus_workflows.phi import decode, encode_text, find_spans, normalize  # noqa: E402
from nexus_workflows.phi.models import TokenMap  # noqa: E402
from nexus_workflows.phi.recognizers import (  # noqa: E402
    _canonical_email,
    _canonical_phone,
    _phones_in_window,
    _validated_email,
)

CORPUS = ROOT / "benchmarks" / "data" / "phi_corpus.jsonl"
CATEGORIES = ("TELEFONO", "EMAIL", "ID")

# The timed message: 500 characters as a patient writes them, with one phone number, one
# spelled-out e-mail address, a CURP and an NSS among dates, doses and lab values.
MESSAGE_500 = (
    "Buenas tardes doctora 🙏 le escribo porque mi mamá sigue con la presión alta, ayer 150/95 "
    "y hoy en la mañana 142/90. Le dieron losartán 50 mg cada 12 horas desde el 12/05/2024 y "
    "metformina 850 mg. Glucosa en ayunas 132 mg/dl, HbA1c 7.4%. La cita es el 03-06-2024 a las "
    "10:30 en el consultorio 4B, ext. 2345. Mi cel es 55 1234 5678 y mi correo maria punto lopez "
    "arroba gmail punto com. CURP LOMA800101MDFPRR09, NSS 12345678903. Pagamos $1,250.00 de la "
    "consulta y $480 del lab (folio 483920). Gracias!!!"
)


assert len(MESSAGE_500) == 500, len(MESSAGE_500)


def load(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def measure_recall(rows: list[dict]) -> bool:
    expected_by_category: Counter[str] = Counter()
    found_by_category: Counter[str] = Counter()
    false_positives: list[tuple[int, str]] = []
    wrong_values = 0
    for row in rows:
        text = row["text"]
        expected = {(start, end, category): value for start, end, category, value in row["spans"]}
        found = set(find_spans(text))
        for span, value in expected.items():
            expected_by_category[span[2]] += 1
            if span in found:
                if normalize(text[span[0] : span[1]], span[2]) == value:
                    found_by_category[span[2]] += 1
                else:
                    wrong_values += 1
        for span in found - set(expected):
            false_positives.append((row["id"], span[2]))
    clean = sum(1 for row in rows if not row["spans"])
    print(f"corpus: {len(rows)} messages, {clean} without any identifier")
    for category in CATEGORIES:
        total, hit = expected_by_category[category], found_by_category[category]
        print(f"  recall {category:<8} {hit:4d}/{total:<4d} {100 * hit / total if total else 100:6.1f}%")
    total, hit = sum(expected_by_category.values()), sum(found_by_category.values())
    print(f"  recall {'all':<8} {hit:4d}/{total:<4d} {100 * hit / total:6.1f}%")
    print(f"  found with a wrong normalised value: {wrong_values}")
    print(f"  false positives: {len(false_positives)}", end="")
    # Message ids and categories only: the texts are synthetic, but this is the habit.
    print(f"  {sorted(false_positives)[:20]}" if false_positives else "")
    return hit == total and not false_positives and not wrong_values


def time_calls(call: Callable[[], object], count: int) -> list[float]:
    clock = time.perf_counter
    durations = []
    for _ in range(count):
        start = clock()
        call()
        durations.append(clock() - start)
    return durations


def describe(label: str, durations: list[float]) -> None:
    ordered = sorted(durations)
    median, p90 = statistics.median(ordered), ordered[int(len(ordered) * 0.9)]
    print(f"  {label:<58} median {median * 1e6:7.0f} µs   p90 {p90 * 1e6:7.0f} µs")


def measure_speed(rows: list[dict], repeats: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    call_command("migrate", verbosity=0)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    server = f"{connection.vendor}"
    load = ", ".join(f"{figure:.1f}" for figure in os.getloadavg())
    print(f"\nspeed: database {server}; python {platform.python_version()}; pinned to one core; load {load}")
    code = f"bench-recall-{uuid.uuid4().hex[:10]}"
    try:
        encoded = encode_text(code, MESSAGE_500)
        assert decode(code, encoded) == MESSAGE_500
        print(f"  message: {len(MESSAGE_500)} characters, {encoded.count('<<')} tokens")
        describe(
            "encode_text, warm (map cached, same message)",
            time_calls(lambda: encode_text(code, MESSAGE_500), repeats),
        )
        describe("find_spans only, same message", time_calls(lambda: find_spans(MESSAGE_500), repeats))

        def cold_recognisers() -> None:
            for memo in (_phones_in_window, _validated_email, _canonical_email, _canonical_phone):
                memo.cache_clear()
            encode_text(code, MESSAGE_500)

        describe(
            "encode_text, map cached, recogniser memo cleared each call",
            time_calls(cold_recognisers, max(1, repeats // 10)),
        )
        # Every corpus message once, padded to 500 characters with its own text.
        texts = [(row["text"] + " ") * (500 // (len(row["text"]) + 1) + 1) for row in rows]
        texts = [text[:500] for text in texts]
        for text in texts:
            encode_text(code, text)
        iterator = iter(texts * (repeats // len(texts) + 1))
        describe(
            f"encode_text, warm, {len(texts)} different corpus messages at 500 chars",
            time_calls(lambda: encode_text(code, next(iterator)), repeats),
        )
    finally:
        TokenMap.objects.for_code(code).delete()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=2_000, help="timed encode_text calls per figure")
    parser.add_argument("--no-speed", action="store_true", help="recall and false positives only")
    parser.add_argument(
        "--corpus",
        type=Path,
        default=CORPUS,
        help="another corpus, e.g. a held-out one (make_phi_corpus.py --seed)",
    )
    args = parser.parse_args()
    rows = load(args.corpus)
    perfect = measure_recall(rows)
    if not args.no_speed:
        measure_speed(rows, args.repeats)
    sys.exit(0 if perfect else 1)


if __name__ == "__main__":
    main()

"""Cost of the phone recogniser on long runs of digits, and on ordinary messages.

    .venv/bin/python benchmarks/phi_phone_runs.py [--sizes 4096 80000] [--repeats 3]

Times ``find_spans`` (what ``encode_text`` calls to find phones, e-mail addresses and IDs)
on adversarial texts anyone can send — digits separated by spaces ("5 5 5 …", "1 2 3 … 0
"), tabs, dots, parentheses, mixed separators, pairs, groups of up to four — at each size,
and on the PHI corpus (benchmarks/data/phi_corpus.jsonl), message by message and joined.
Each figure is the best of ``--repeats`` calls, every memo of the recognisers cleared
before each call (a new message's cost, not a repeated one's). Prints total time, µs per
character and the number of spans found. Synthetic digits only. Figures only: nothing
here is asserted (tests/phi/test_phone_runs.py checks what is found).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CORPUS = ROOT / "benchmarks" / "data" / "phi_corpus.jsonl"


def _repeat(piece: str) -> Callable[[int], str]:
    return lambda size: (piece * (size // len(piece) + 1))[:size]


def _seeded(name: str, make: Callable[[random.Random], str]) -> Callable[[int], str]:
    def build(size: int) -> str:
        rng = random.Random(f"{name}-{size}")
        pieces: list[str] = []
        length = 0
        while length < size:
            pieces.append(make(rng))
            length += len(pieces[-1])
        return "".join(pieces)[:size]

    return build


def _digits(rng: random.Random, count: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(count))


MIXED_SEPARATORS = [" ", "\t", ".", "-", "(", ")", " (", ") ", ". "]
# name -> text of a given size
ADVERSARIAL: dict[str, Callable[[int], str]] = {
    "'5 5 5 …' spaces": _repeat("5 "),
    "'1 2 3 … 0 ' spaces": _repeat("1 2 3 4 5 6 7 8 9 0 "),
    "'5\\t5\\t…' tabs": _repeat("5\t"),
    "'5  5  …' two spaces": _repeat("5  "),
    "'5.5.5…' dots": _repeat("5."),
    "'5. 5. …' dot and space": _repeat("5. "),
    "'(5) (5) …' parentheses": _repeat("(5) "),
    "'5-5-5…' dashes": _repeat("5-"),
    "'5 5 5 … 55 1234 5678'": lambda size: _repeat("5 ")(size - 12) + "55 1234 5678",
    "random digits, mixed separators": _seeded(
        "mixed", lambda rng: rng.choice("0123456789") + rng.choice(MIXED_SEPARATORS)
    ),
    "'55 12 34 56 78 ' pairs": _repeat("55 12 34 56 78 "),
    "random pairs, spaces": _seeded("pairs", lambda rng: _digits(rng, 2) + " "),
    "random groups of 1-4, spaces": _seeded("groups", lambda rng: _digits(rng, rng.randint(1, 4)) + " "),
    "random '55 1234 5678 ' numbers": _seeded(
        "numbers", lambda rng: f"{_digits(rng, 2)} {_digits(rng, 4)} {_digits(rng, 4)} "
    ),
}


def _clear_memos() -> None:
    """Empty every memo of the recognisers, so that each call costs what a new message does."""
    from nexus_workflows.phi import recognizers

    for value in vars(recognizers).values():
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            clear()


def _best(call: Callable[[], object], repeats: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        _clear_memos()
        start = time.perf_counter()
        result = call()
        best = min(best, time.perf_counter() - start)
    return best, result


def _line(name: str, chars: int, seconds: float, spans: int) -> str:
    return (
        f"  {name:<36} {chars:>7,} chars  {seconds * 1e3:10.2f} ms  "
        f"{seconds / chars * 1e6:8.3f} µs/char  {spans:>5} spans"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_096, 80_000])
    parser.add_argument("--repeats", type=int, default=3, help="calls per input; the best counts")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from nexus_workflows.phi import find_spans

    print(f"python {platform.python_version()}; {os.cpu_count()} CPUs; best of {args.repeats}")
    for size in args.sizes:
        print(f"\nadversarial, {size:,} characters:")
        for name, build in ADVERSARIAL.items():
            text = build(size)
            seconds, spans = _best(lambda text=text: find_spans(text), args.repeats)
            print(_line(name, len(text), seconds, len(spans)))

    rows = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    texts = [row["text"] for row in rows]
    chars = sum(len(text) for text in texts)
    print(f"\nordinary text (the PHI corpus, {len(texts)} messages):")
    seconds, found = _best(lambda: [find_spans(text) for text in texts], args.repeats)
    print(_line("message by message", chars, seconds, sum(len(spans) for spans in found)))
    joined = "\n".join(texts)
    seconds, spans = _best(lambda: find_spans(joined), args.repeats)
    print(_line("joined in one text", len(joined), seconds, len(spans)))


if __name__ == "__main__":
    main()

"""How often lists of clinical values are taken for phone numbers (false positives).

    .venv/bin/python benchmarks/phi_lookalikes.py [--seed 7] [--count 2000]

Two seeded generators of messages without any identifier, as patients write them:
``heart_rates`` (five two-digit values in a row after a vital sign's label: "FC 91 88 90 84
73", often valid Mexican numbers in pairs) and ``lab_values`` (lists of lab results,
blood pressures, platelets with a space for thousands, doses). Every TELEFONO the
recognisers return in them is a false positive: it hides a clinical value from the LLM.
Prints the share of messages with one, and a few examples (synthetic values only).
Figures only: nothing here is asserted (tests/phi/test_lookalikes.py pins a few seeds).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEART_LABELS = [
    "FC", "fc", "FC:", "Fc", "frecuencia cardiaca", "frecuencia cardíaca", "frecuencias", "pulso",
    "pulsos", "FC de la semana", "la FC fue", "FC en la mañana", "ritmo cardiaco", "FC =", "F.C.",
    "lpm", "latidos", "saturación", "sat", "SatO2", "SpO2", "glucosas", "glucosa", "FR",
    "frecuencia respiratoria",
]  # fmt: skip
HEART_UNITS = ["", "", "", " lpm", " x min", " por minuto", " latidos por minuto", " bpm", "%", " mg/dl"]
LEADS = [
    "Buenas tardes doctora, ", "hola, ", "Doctor le mando los datos: ", "", "Mi papá ", "ayer ",
    "le comento que ", "Buen día. ", "DOCTORA ",
]  # fmt: skip
TAILS = [". Gracias", ", ¿está bien?", "", " 🙏", ". ¿Le aumento la dosis?", "\nsaludos", ". ¿Es normal?"]


def heart_rates(rng: random.Random) -> str:
    """Five two-digit values in a row after a vital sign's label (60-99, or a saturation)."""
    label = rng.choice(HEART_LABELS)
    low, high = (88, 99) if label.lower().startswith(("sat", "spo")) else (60, 99)
    if label.lower().startswith(("fr", "frecuencia resp")):
        low, high = (12, 30)
    values = " ".join(str(rng.randint(low, high)) for _ in range(5))
    unit = rng.choice(HEART_UNITS)
    return f"{rng.choice(LEADS)}{label} {values}{unit}{rng.choice(TAILS)}"


def bare_heart_rates(rng: random.Random) -> str:
    """The plainest case: "FC" and five heart rates of 60-99, nothing else."""
    return "FC " + " ".join(str(rng.randint(60, 99)) for _ in range(5))


def _lab(rng: random.Random) -> str:
    count = rng.randint(2, 6)

    def series(low: int, high: int) -> str:
        return " ".join(str(rng.randint(low, high)) for _ in range(count))

    pressures = " ".join(f"{rng.randint(100, 160)}/{rng.randint(60, 100)}" for _ in range(count))
    options: list[Callable[[], str]] = [
        lambda: f"glucosa {series(70, 300)}",
        lambda: f"glucosas {series(85, 180)} mg/dl",
        lambda: f"glucosa en ayunas {series(70, 180)}",
        lambda: f"TA {pressures}",
        lambda: f"presión {pressures} mmHg",
        lambda: f"Hb {rng.randint(8, 17)}.{rng.randint(0, 9)}",
        lambda: f"Hb {rng.randint(8, 17)}.{rng.randint(0, 9)} Hto {rng.randint(25, 50)}",
        lambda: f"plaquetas {rng.randint(100, 450)} 000",
        lambda: f"leucocitos {rng.randint(4, 15)} {rng.randint(100, 900)}",
        lambda: f"colesterol {rng.randint(150, 280)} HDL {rng.randint(30, 70)} LDL {rng.randint(70, 190)}",
        lambda: f"triglicéridos {series(100, 400)}",
        lambda: f"creatinina {rng.randint(0, 3)}.{rng.randint(0, 9)} urea {rng.randint(15, 80)}",
        lambda: f"sodio {rng.randint(130, 148)} potasio {rng.randint(3, 5)}.{rng.randint(0, 9)}",
        lambda: f"FC {series(55, 110)}",
        lambda: f"FR {series(12, 28)}",
        lambda: f"temperatura {rng.randint(36, 39)}.{rng.randint(0, 9)}",
        lambda: f"peso {series(50, 110)} kg",
        lambda: f"HbA1c {rng.randint(5, 11)}.{rng.randint(0, 9)}%",
        lambda: f"{series(90, 250)}",
        lambda: (
            f"ácido úrico {rng.randint(3, 9)}.{rng.randint(0, 9)} "
            f"TGO {rng.randint(10, 90)} TGP {rng.randint(10, 90)}"
        ),
        lambda: f"insulina {series(4, 40)} unidades",
        lambda: f"metformina {rng.choice(['500', '850', '1000'])} mg {rng.randint(1, 3)} veces",
    ]
    return rng.choice(options)()


def lab_values(rng: random.Random) -> str:
    """One to four lab results, vitals or doses in a row, joined as patients join them."""
    parts = [_lab(rng) for _ in range(rng.randint(1, 4))]
    joiner = rng.choice([" ", ", ", " y ", "; ", "\n", " "])
    return f"{rng.choice(LEADS)}{joiner.join(parts)}{rng.choice(TAILS)}"


GENERATORS: dict[str, Callable[[random.Random], str]] = {
    "bare_heart_rates": bare_heart_rates,
    "heart_rates": heart_rates,
    "lab_values": lab_values,
}


def messages(kind: str, seed: int, count: int) -> list[str]:
    rng = random.Random(f"{kind}-{seed}")
    return [GENERATORS[kind](rng) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--count", type=int, default=2_000, help="messages per generator")
    parser.add_argument("--examples", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from nexus_workflows.phi.recognizers import find

    for kind in GENERATORS:
        texts = messages(kind, args.seed, args.count)
        hit = [text for text in texts if any(found.category == "TELEFONO" for found in find(text, "MX"))]
        share = 100 * len(hit) / len(texts)
        print(f"{kind}: {len(hit)}/{len(texts)} messages with a phone number found ({share:.1f}%)")
        for text in hit[: args.examples]:
            print(f"  {text!r}")


if __name__ == "__main__":
    main()

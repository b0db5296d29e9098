"""Context that tells a phone-shaped run of digits to be a clinical value or a folio.

Used by :mod:`.recognizers` on a number the matcher has already called valid, to drop the
two shapes patients also give to values that are no phone number:

- **a list of values after a clinical label** (``FC 91 88 90 84 73``, ``glucosa 284 255
  95 98``): five pairs, or an area code followed by groups of two and three digits, are
  how Mexican numbers are written, and are also how a series of heart rates or glucoses
  is. See :func:`clinical_series`.
- **a folio written with the international prefix** (``folio 0064867038``): ``phonenumbers``
  reads ``00``/``09`` as Mexico's international prefix. See :func:`reference_number`.

Both only ever drop a number that no phone cue word ("cel", "tel", "whatsapp", …) stands
before; the caller decides that. Everything here reads bounded slices of the text around
one number, so a message costs linear time however many numbers it holds.
"""

from __future__ import annotations

import re

# Words that name a measured value (lower case, with and without accents). The last word
# of a label counts: "frecuencia cardiaca" ends in "cardiaca", "ácido úrico" in "úrico".
_LABELS = frozenset({
    "fc", "f.c", "fr", "f.r", "ta", "t/a", "t.a", "pulso", "pulsos", "frecuencia", "frecuencias",
    "cardiaca", "cardíaca", "cardiacas", "cardíacas", "cardiaco", "cardíaco", "respiratoria",
    "respiratorias", "ritmo",
    "latidos", "lpm", "bpm", "sat", "sato2", "spo2", "saturación", "saturacion", "saturaciones",
    "oxigenación", "oxigenacion", "oxígeno", "oxigeno", "glucosa", "glucosas", "glucemia", "glucemias",
    "glicemia", "glicemias", "dextrostix", "destrostix", "dxt", "presión", "presion", "presiones",
    "tensión", "tension", "sistólica", "sistolica", "diastólica", "diastolica", "temperatura", "temp",
    "peso", "talla", "imc", "hb", "hemoglobina", "hto", "hematocrito", "plaquetas",
    "leucocitos", "neutrófilos", "neutrofilos", "linfocitos", "colesterol", "hdl", "ldl",
    "triglicéridos", "trigliceridos", "tg", "creatinina", "urea", "bun", "sodio", "na", "potasio",
    "cloro", "calcio", "magnesio", "fósforo", "fosforo", "úrico", "urico", "tgo", "tgp", "ast", "alt",
    "bilirrubina", "albúmina", "albumina", "insulina", "hba1c", "tsh", "inr", "ferritina", "hierro",
    "cifras", "mediciones", "lecturas", "dextros", "fcf", "ayunas", "postprandial",
})  # fmt: skip
# Words that may stand between a label and its values: "FC de la semana 91 88 …".
_FILLERS = frozenset({
    "de", "del", "la", "el", "las", "los", "en", "es", "fue", "fueron", "son", "eran", "hoy", "ayer",
    "mañana", "manana", "tarde", "noche", "semana", "promedio", "entre", "y", "mis", "sus",
})  # fmt: skip
# Units that end a list of values: "91 88 90 84 73 lpm", "… x min", "… mg/dl".
_UNIT_AFTER = re.compile(
    r"[ \t]*(?:lpm|bpm|rpm|latidos|respiraciones|x[ \t]?min|x'|por[ \t]min|mg/?dl|mmhg|mmol|kg|%|"
    r"ui\b|unidades|°|grados)"
)
_TOKEN = re.compile(r"[^\s,;:=()]+")
_VALUE = re.compile(r"[0-9]{1,3}(?:[./][0-9]{1,3})?")
# How far before a number its label may stand, and how many values and fillers between.
_LABEL_REACH = 80
_MAX_STEPS = 12
# A series of one measurement stays within a factor of three (heart rates 60-99,
# glucoses 90-250); the pairs of a phone number (00-99) rarely do.
_SPREAD = 3

# Words that announce a reference number: "folio 0064867038", "no. de orden 00…".
_REFERENCE_CUE = re.compile(
    r"(?:folio|ref|referencia|orden|pedido|gu[ií]a|ticket|factura|recibo|expediente|exp|cuenta|"
    r"clave|c[oó]digo|lote|receta|rastreo|transacci[oó]n|operaci[oó]n|autorizaci[oó]n|"
    r"confirmaci[oó]n|contrato|p[oó]liza|solicitud|reporte|pedimento)"
    r"[\w.]*(?:[\s:#.\-]+(?:es|era|de|del|la|el|mi|su|n[uú]mero|no\.?|n[º°o]\.?))*[\s:#.\-]*$"
)
# Mexico's international prefixes as phonenumbers reads them ("0[09]").
_INTERNATIONAL_PREFIXES = ("00", "09")
# A number dialled abroad with ten digits or fewer in all has eight or fewer after the
# prefix: a country code and a national number that short belong to a few small islands
# (Falklands, Niue…). Ten digits in one piece is a Mexican national number's length, and a
# folio's, and no Mexican number starts with 0.
_SHORT_INTERNATIONAL = 10


def list_shaped(surface: str) -> bool:
    """Whether a national number is written as a list of values is: four groups or more,
    none of four digits or more (pairs, "81 111 85 114", "998 123 45 67")."""
    groups = re.findall(r"[0-9]+", surface)
    return (
        len(groups) >= 4 and max(len(group) for group in groups) <= 3 and not surface.startswith(("+", "("))
    )


def _one_series(surface: str) -> bool:
    """Whether the groups read as one measurement's values: none written with a leading
    zero or below 10, the largest at most three times the smallest."""
    groups = re.findall(r"[0-9]+", surface)
    if any(group.startswith("0") for group in groups):
        return False
    values = [int(group) for group in groups]
    return min(values) >= 10 and max(values) <= _SPREAD * min(values)


def _label_before(lowered: str, start: int) -> bool:
    """Whether a clinical label stands before ``start`` with only values ("72", "120/80",
    "13.5") and filler words between it and the number, on the same line."""
    line = lowered[max(0, start - _LABEL_REACH) : start].rsplit("\n", 1)[-1]
    tokens = _TOKEN.findall(line)
    for token in reversed(tokens[-_MAX_STEPS:]):
        word = token.strip(".:=-#")
        if _VALUE.fullmatch(word) or word in _FILLERS:
            continue
        return word in _LABELS or token.rstrip(":=") in _LABELS
    return False


def _unit_after(lowered: str, end: int) -> bool:
    """Whether a clinical unit follows ``end``, maybe after more values of the list."""
    line = lowered[end : end + _LABEL_REACH].split("\n", 1)[0]
    position = 0
    for _ in range(_MAX_STEPS):
        value = re.match(r"[ \t]+[0-9]{1,3}(?![0-9])", line[position:])
        if value is None:
            break
        position += value.end()
    return _UNIT_AFTER.match(line, position) is not None


def clinical_series(lowered: str, start: int, end: int) -> bool:
    """Whether the national number at ``lowered[start:end]`` is a list of clinical values:
    written as a list is, its groups one measurement's, and a clinical label before it or
    a unit after it. The caller keeps the number when a phone cue word stands before it."""
    surface = lowered[start:end]
    if not list_shaped(surface) or not _one_series(surface):
        return False
    return _label_before(lowered, start) or _unit_after(lowered, end)


def reference_number(lowered: str, start: int, end: int) -> bool:
    """Whether a number written in one piece with the international prefix ("00…", "09…",
    no "+", no space) is a folio: a reference word before it, or ten digits or fewer. A
    number abroad written with spaces ("001 415 555 2671") is left to the matcher. The
    caller keeps the number when a phone cue word stands before it."""
    surface = lowered[start:end]
    if not (surface.isdigit() and surface.startswith(_INTERNATIONAL_PREFIXES)):
        return False
    if surface.startswith("0052"):
        return False  # a Mexican number dialled as from abroad: a phone whatever the word before
    if len(surface) <= _SHORT_INTERNATIONAL:
        return True
    line = lowered[max(0, start - 30) : start].rsplit("\n", 1)[-1]
    return _REFERENCE_CUE.search(line) is not None

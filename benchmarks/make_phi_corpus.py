"""Generates benchmarks/data/phi_corpus.jsonl: synthetic Mexican-Spanish patient messages.

    .venv/bin/python benchmarks/make_phi_corpus.py            # writes the corpus
    .venv/bin/python benchmarks/make_phi_corpus.py --check    # fails if the file differs

Run once and checked in; the seed is fixed, so running it again gives the same file. Every
identifier is fake and made here: phone numbers are drawn until ``phonenumbers`` calls them
valid, CURP/RFC/NSS get their check digits computed (some deliberately wrong, as patients
mistype them). The spans are not found by any recogniser: they are where the generator
inserted each identifier, so the annotations are independent of the code under test.

Each line: ``{"id", "kind": "phi"|"clean", "text", "spans": [[start, end, category, value]]}``
where ``value`` is the normalised value the identifier must get (E.164, lower-case address,
upper-case ID). Half the messages ("clean") hold no identifier but many dates, times,
amounts, doses, lab values, postal codes, rooms, extensions, years and folio numbers, some
built to look like identifiers without being valid ones.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import phonenumbers
from stdnum.mx import curp as stdnum_curp

# RENAPO's inconvenient words (a CURP never starts with one); python-stdnum keeps the list.
INCONVENIENT = frozenset(getattr(stdnum_curp, "_name_blacklist", ()))

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "data" / "phi_corpus.jsonl"
SEED = 16
MESSAGES_PER_KIND = 200

Segment = tuple[str, str, str | None, str | None]  # (kind, text, category, value)

FIRST = [
    "maria",
    "jose",
    "guadalupe",
    "juan",
    "ana",
    "luis",
    "rosa",
    "carlos",
    "fernanda",
    "miguel",
    "sofia",
    "jorge",
    "lucia",
    "pedro",
    "alejandra",
    "ricardo",
    "paola",
    "arturo",
    "ximena",
    "raul",
]
LAST = [
    "lopez",
    "hernandez",
    "garcia",
    "martinez",
    "gonzalez",
    "perez",
    "rodriguez",
    "sanchez",
    "ramirez",
    "cruz",
    "flores",
    "gomez",
    "morales",
    "vazquez",
    "reyes",
    "jimenez",
    "torres",
    "diaz",
    "ruiz",
    "mendoza",
]
DOMAINS = [
    "gmail.com",
    "hotmail.com",
    "outlook.com",
    "yahoo.com.mx",
    "prodigy.net.mx",
    "live.com.mx",
    "icloud.com",
    "clinica-salud.mx",
    "uabc.edu.mx",
    "correo.unam.mx",
    "imss.gob.mx",
]
AREA_2 = ["55", "56", "33", "81"]
AREA_3 = [
    "222",
    "442",
    "477",
    "664",
    "998",
    "999",
    "614",
    "662",
    "744",
    "871",
    "951",
    "961",
    "229",
    "618",
    "667",
]
FOREIGN = ["US", "ES", "CO", "GT", "AR", "GB", "DE", "CA"]
STATES = [
    "AS",
    "BC",
    "BS",
    "CC",
    "CL",
    "CM",
    "CS",
    "CH",
    "DF",
    "DG",
    "GT",
    "GR",
    "HG",
    "JC",
    "MC",
    "MN",
    "MS",
    "NT",
    "NL",
    "OC",
    "PL",
    "QT",
    "QR",
    "SP",
    "SL",
    "SR",
    "TC",
    "TS",
    "TL",
    "VZ",
    "YN",
    "ZS",
    "NE",
]
CONSONANTS = "BCDFGHJKLMNPQRSTVWXYZ"
EMOJI = ["🙏", "😊", "😷", "🤒", "💊", "❤️", "👍", "😢", "🏥", "🙂", "😅", "🤞"]
MONTHS = [
    "enero",
    "febrero",
    "marzo",
    "abril",
    "mayo",
    "junio",
    "julio",
    "agosto",
    "septiembre",
    "octubre",
    "noviembre",
    "diciembre",
]


# Check digits, written here again rather than imported, so that the corpus does not
# depend on the code it measures.


def curp_check_digit(first17: str) -> str:
    alphabet = "0123456789ABCDEFGHIJKLMNÑOPQRSTUVWXYZ"
    total = sum(alphabet.index(char) * (18 - position) for position, char in enumerate(first17))
    return str((10 - total % 10) % 10)


def rfc_check_digit(first: str) -> str:
    alphabet = "0123456789ABCDEFGHIJKLMN&OPQRSTUVWXYZ Ñ"
    total = sum(alphabet.index(char) * (13 - position) for position, char in enumerate(first.rjust(12)))
    digit = 11 - total % 11
    return {11: "0", 10: "A"}.get(digit, str(digit))


def nss_check_digit(first10: str) -> str:
    total = 0
    for position, char in enumerate(first10):
        product = int(char) * (1 + position % 2)
        total += sum(divmod(product, 10))
    return str((10 - total % 10) % 10)


class Generator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def pick(self, options: list[str]) -> str:
        return self.rng.choice(options)

    # --- identifiers ------------------------------------------------------------------

    def mx_number(self) -> tuple[str, str]:
        """(area code, local part) of a valid Mexican number."""
        while True:
            area = self.pick(AREA_2 + AREA_3)
            local = "".join(self.rng.choice("0123456789") for _ in range(10 - len(area)))
            if local[0] in "01":
                continue
            number = phonenumbers.parse(area + local, "MX")
            if phonenumbers.is_valid_number(number):
                return area, local

    def phone(self) -> Segment:
        if self.rng.random() < 0.15:
            return self.foreign_phone()
        area, local = self.mx_number()
        national = area + local
        e164 = "+52" + national
        if len(area) == 2:
            grouped = [
                f"{area} {local[:4]} {local[4:]}",
                f"{area}-{local[:4]}-{local[4:]}",
                f"({area}) {local[:4]}-{local[4:]}",
                f"{area}.{local[:4]}.{local[4:]}",
                f"({area}){local[:4]}-{local[4:]}",
                f"{area} {local}",
            ]
        else:
            grouped = [
                f"{area} {local[:3]} {local[3:]}",
                f"({area}) {local[:3]} {local[3:]}",
                f"{area}-{local[:3]}-{local[3:5]}-{local[5:]}",
                f"{area}.{local[:3]}.{local[3:]}",
                f"({area}) {local[:3]}-{local[3:]}",
                f"{area} {local}",
            ]
        pairs = " ".join(national[i : i + 2] for i in range(0, 10, 2))
        three = f"{national[:3]} {national[3:6]} {national[6:]}"
        main = self.pick(grouped)
        forms = [
            national,
            main,
            main,
            pairs,
            pairs.replace(" ", "-"),
            three,
            f"+52 {main}",
            f"+52{national}",
            f"52 {main}",
            f"+52 1 {main}",
            f"521 {main}",
            f"521{national}",
            f"044 {main}",
            f"045 {main}",
            f"01 {main}",
            f"1 {main}",
            f"+52 ({area}) {local}",
            "\u00a0".join(main.split(" ")),
            self.fullwidth(national),
            self.fullwidth(main),
        ]
        return ("phi", self.pick(forms), "TELEFONO", e164)

    def foreign_phone(self) -> Segment:
        region = self.pick(FOREIGN)
        example = phonenumbers.example_number_for_type(region, phonenumbers.PhoneNumberType.MOBILE)
        assert example is not None
        digits = str(example.national_number)
        while True:
            changed = digits[:-4] + "".join(self.rng.choice("0123456789") for _ in range(4))
            number = phonenumbers.parse(f"+{example.country_code}{changed}", None)
            if phonenumbers.is_valid_number(number):
                break
        e164 = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
        written = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.INTERNATIONAL)
        forms = [written, e164, written.replace(" ", "-", 1) if region != "US" else written]
        return ("phi", self.pick(forms), "TELEFONO", e164)

    def fullwidth(self, text: str) -> str:
        return "".join(chr(ord(char) - ord("0") + 0xFF10) if char.isdigit() else char for char in text)

    def email(self) -> Segment:
        first, last = self.pick(FIRST), self.pick(LAST)
        local = self.pick(
            [
                f"{first}.{last}",
                f"{first}{last}{self.rng.randint(1, 99)}",
                f"{first}_{last}",
                f"{first[0]}{last}",
                f"{first}.{last}+citas",
                f"{first}{self.rng.randint(60, 99)}",
            ]
        )
        domain = self.pick(DOMAINS)
        value = f"{local}@{domain}"
        style = self.rng.random()
        if "+" in local or style < 0.35:
            written = value
            if self.rng.random() < 0.4:
                written = local.capitalize() + "@" + domain.upper()
        elif style < 0.6:
            spoken_local = local.replace(".", " punto ").replace("_", " guion bajo ")
            written = f"{spoken_local} arroba {domain.replace('.', ' punto ')}"
        elif style < 0.75:
            written = f"{local}(at){domain.replace('.', '(dot)')}"
        elif style < 0.85:
            written = f"{local} [at] {domain.replace('.', ' [dot] ')}"
        else:
            written = f"{local} @ {domain.replace('.', ' . ')}"
        return ("phi", written, "EMAIL", value.lower())

    def birth(self) -> str:
        return f"{self.rng.randint(40, 99):02d}{self.rng.randint(1, 12):02d}{self.rng.randint(1, 28):02d}"

    def name_letters(self) -> str:
        """The four letters of a person's CURP and RFC; RENAPO replaces the second letter of
        an inconvenient word by X."""
        last = self.pick(LAST).upper()
        vowel = next((char for char in last[1:] if char in "AEIOU"), "X")
        letters = last[0] + vowel + self.pick(LAST)[0].upper() + self.pick(FIRST)[0].upper()
        return letters[0] + "X" + letters[2:] if letters in INCONVENIENT else letters

    def curp(self) -> Segment:
        letters = self.name_letters()
        born_2000s = self.rng.random() < 0.25
        birth = f"{self.rng.randint(0, 23):02d}{self.birth()[2:]}" if born_2000s else self.birth()
        body = (
            letters
            + birth
            + self.pick(["H", "M"])
            + self.pick(STATES)
            + "".join(self.pick(list(CONSONANTS)) for _ in range(3))
            + (self.pick(["A", "B"]) if born_2000s else "0")
        )
        check = curp_check_digit(body)
        if self.rng.random() < 0.2:  # mistyped last digit: still the patient's CURP
            check = str((int(check) + self.rng.randint(1, 9)) % 10)
        value = body + check
        written = value.lower() if self.rng.random() < 0.15 else value
        return ("phi", written, "ID", value)

    def rfc(self) -> tuple[str, Segment]:
        company = self.rng.random() < 0.3
        if company:
            letters = "".join(self.pick(list("ABCDEFGHIJKLMNOPRSTUVZ")) for _ in range(3))
        else:
            letters = self.name_letters()
        # SAT's homoclave: two characters (the first 1-9 or A-V), then the check digit.
        body = letters + self.birth() + self.pick(list("123456789ABCDEFGHIJKLMNPQRSTUV"))
        body += self.pick(list("123456789ABCDEFGHIJKLMNPQRSTUVWXYZ"))
        check = rfc_check_digit(body)
        cue = self.pick(["RFC ", "RFC: ", "mi rfc es ", "R.F.C. ", "", ""])
        if cue and self.rng.random() < 0.25:  # a mistyped check digit, announced by "RFC"
            check = self.pick([c for c in "0123456789A" if c != check])
        value = body + check
        return cue, ("phi", value, "ID", value)

    def nss(self) -> tuple[str, Segment]:
        first10 = f"{self.rng.randint(1, 99):02d}" + "".join(self.rng.choice("0123456789") for _ in range(8))
        check = nss_check_digit(first10)
        cue = self.pick(["NSS ", "NSS: ", "mi número de seguro social es ", "afiliación IMSS ", ""])
        if cue and self.rng.random() < 0.2:  # a mistyped check digit, announced by "NSS"
            check = str((int(check) + self.rng.randint(1, 9)) % 10)
        digits = first10 + check
        written = self.pick(
            [
                digits,
                digits,
                f"{digits[:2]}-{digits[2:4]}-{digits[4:6]}-{digits[6:10]}-{digits[10]}",
                f"{digits[:10]}-{digits[10]}",
            ]
        )
        return cue, ("phi", written, "ID", digits)

    # --- clinical noise (never an identifier) ------------------------------------------

    def date(self) -> str:
        d, m, y = self.rng.randint(1, 28), self.rng.randint(1, 12), self.rng.randint(2019, 2026)
        return self.pick(
            [
                f"{d:02d}/{m:02d}/{y}",
                f"{d}/{m}/{y % 100:02d}",
                f"{d:02d}-{m:02d}-{y}",
                f"{d:02d}.{m:02d}.{y}",
                f"{y}-{m:02d}-{d:02d}",
                f"{d} de {MONTHS[m - 1]} de {y}",
                f"{d} de {MONTHS[m - 1]}",
                f"{d:02d}/{m:02d}",
                f"{d:02d}-{m:02d}-{y} {self.rng.randint(7, 20):02d}:{self.pick(['00', '15', '30', '45'])}",
                f"{y}-{m:02d}-{d:02d} {self.rng.randint(7, 20):02d}:{self.pick(['00', '30'])}",
                f"{d:02d} {m:02d} {y}",
            ]
        )

    def time(self) -> str:
        h = self.rng.randint(7, 20)
        return self.pick(
            [
                f"{h}:{self.pick(['00', '15', '30', '45'])}",
                f"{h}.30 hrs",
                f"{h % 12 or 12} am",
                f"{h}:00 h",
                f"de {h} a {h + 2} hrs",
                f"{h}:{self.pick(['05', '20', '40'])} pm",
            ]
        )

    def amount(self) -> str:
        n = self.rng.choice([350, 480, 1250, 2300, 12500, 850, 45000, 1250000, 25000000])
        return self.pick(
            [
                f"${n:,}.00",
                f"$ {n}",
                f"{n} pesos",
                f"MXN {n:,}",
                f"${n:,}",
                f"$ {n:,}".replace(",", " "),
                f"{n:,} pesos mexicanos",
            ]
        )

    def dose(self) -> str:
        milligrams = self.pick(["500", "250", "850", "1000", "20", "50"])
        hours = self.pick(["6", "8", "12", "24"])
        return self.pick(
            [
                f"{milligrams} mg cada {hours} horas",
                f"1 tableta cada {self.pick(['8', '12'])} hrs por {self.pick(['5', '7', '10', '14'])} días",
                f"{self.pick(['10', '12', '20', '30'])} UI en la noche",
                f"{self.pick(['0.5', '1', '2.5', '5'])} ml",
                f"{self.pick(['20', '15', '10'])} gotas",
                "2 disparos cada 4 horas",
                "1/2 tableta",
                f"{self.pick(['1', '2'])} g IV cada {self.pick(['8', '12'])} h",
            ]
        )

    def vitals(self) -> str:
        return self.pick(
            [
                f"{self.rng.randint(100, 160)}/{self.rng.randint(60, 100)}",
                f"presión {self.rng.randint(100, 160)}/{self.rng.randint(60, 100)} mmHg",
                f"glucosa {self.rng.randint(70, 300)} mg/dl",
                f"glucosa en ayunas {self.rng.randint(70, 180)}",
                "glucosas " + " ".join(str(self.rng.randint(85, 180)) for _ in range(4)),
                f"HbA1c {self.rng.randint(5, 11)}.{self.rng.randint(0, 9)}%",
                f"colesterol {self.rng.randint(150, 280)} y triglicéridos {self.rng.randint(100, 400)}",
                f"plaquetas {self.rng.randint(150, 400)} 000",
                f"leucocitos {self.rng.randint(4, 15)} {self.rng.randint(100, 900)}",
                f"temperatura {self.rng.randint(36, 39)}.{self.rng.randint(0, 9)}",
                f"saturación {self.rng.randint(88, 99)}%",
                f"peso {self.rng.randint(50, 110)}.{self.rng.randint(0, 9)} kg",
                f"talla 1.{self.rng.randint(45, 90)} m",
                f"pulso {self.rng.randint(55, 110)} lpm",
                f"creatinina 1.{self.rng.randint(0, 9)}",
                f"TSH {self.rng.randint(1, 9)}.{self.rng.randint(0, 9)} mUI/L",
                f"INR 2.{self.rng.randint(0, 9)}",
                f"semana {self.rng.randint(8, 40)} de embarazo",
            ]
        )

    def place(self) -> str:
        return self.pick(
            [
                f"C.P. {self.rng.randint(1000, 99999):05d}",
                f"CP {self.rng.randint(1000, 99999):05d}",
                f"habitación {self.rng.randint(100, 999)}",
                f"cama {self.rng.randint(1, 40)}",
                f"consultorio {self.rng.randint(1, 20)}{self.pick(['', 'B', 'A'])}",
                f"piso {self.rng.randint(1, 9)}",
                f"la ext. {self.rng.randint(100, 9999)}",
                f"la extensión {self.rng.randint(100, 999)}",
            ]
        )

    def year(self) -> str:
        return self.pick(
            [
                f"desde {self.rng.randint(1985, 2025)}",
                f"en {self.rng.randint(1960, 2025)}",
                f"desde el año {self.rng.randint(1990, 2025)}",
                f"de {self.rng.randint(1950, 2000)}",
            ]
        )

    def folio(self) -> str:
        """Order and folio numbers that are no valid identifier (checked here, not by the recogniser)."""
        kind = self.rng.randint(0, 8)
        if kind == 0:
            return f"folio {self.rng.randint(100000, 999999)}"
        if kind == 1:
            return f"orden {self.rng.randint(2019, 2026)}-{self.rng.randint(1, 999999):06d}"
        if kind == 2:
            return f"pedido #A-{self.rng.randint(10000, 99999)}"
        if kind == 3:
            # Ten digits starting with 0 or 1: never a Mexican number.
            return f"folio {self.pick(['0', '1'])}{self.rng.randint(0, 999999999):09d}"
        if kind == 4:
            # Eleven digits, first 2-9, not "52…", and a wrong NSS check digit.
            while True:
                digits = f"{self.rng.randint(2, 9)}{self.rng.randint(0, 9999999999):010d}"
                if not digits.startswith("52") and nss_check_digit(digits[:10]) != digits[10]:
                    return f"guía {digits}"
        if kind == 5:
            # An RFC-shaped invoice number with a wrong check digit.
            while True:
                body = (
                    self.pick(["FAC", "REM", "NOT", "PED"]) + self.birth() + f"{self.rng.randint(0, 99):02d}"
                )
                last = str(self.rng.randint(0, 9))
                if rfc_check_digit(body) != last:
                    return f"factura {body}{last}"
        if kind == 6:
            # CURP-shaped, but with a state code that does not exist.
            body = "LOMA" + self.birth() + "M" + self.pick(["XX", "MX", "ZZ", "CD"]) + "PRR0"
            return f"clave {body}{curp_check_digit(body)}"
        if kind == 7:
            return (
                f"lote {self.pick(['B', 'L', 'K'])}{self.rng.randint(1000, 9999)}{self.pick(['X', 'A', 'Z'])}"
            )
        return f"receta No. {self.rng.randint(0, 9999999):07d}"

    # --- messages ------------------------------------------------------------------------

    def clean_message(self) -> list[Segment]:
        templates = [
            "Buenas tardes doctora, a mi mamá le salió {v} y le dieron {m}. ¿Está bien?",
            "hola, la cita es el {d} a las {t}, en {l}. Traigo los estudios: {v}, {v}",
            "Doctor ya me hice los análisis: {v}, {v} y {v}.\nLe pago {a} en la recepción?",
            "Me recetaron {m} desde el {d}. Hoy me salió {v} 😢",
            "Buen día. Le comparto resultados del {d}\n{v}\n{v}\n{v}\nGracias",
            "la consulta costo {a} y el laboratorio {a}, y sigo igual: {v}",
            "Ya llegué, estoy en {l}, {l}. Me dijeron que espere hasta las {t}",
            "Mi esposo esta en {l} desde el {d}, le ponen {m}. Ahorita {v}",
            "dra me salio {v} y {v}, tomo {m}, soy diabética {y}",
            "Compré una arroba de naranjas por {a}, le traigo a las 8 en punto. Por cierto {v}",
            "Recibí el {o} del laboratorio, dice {v}. ¿Lo llevo el {d}?",
            "Para confirmar: {o}, {a}. Desde mi punto de vista el {m} no me hace nada",
            "Ya pagué {a} con el {o}, la cita quedó {d} {t}",
            "¿Me puede cambiar la cita del {d} al {d}? Trabajo hasta las {t} y vivo en {l}",
            "Le escribo de {l}. Sigo con {m}, {v}; el {o} ya está listo",
            "HOY {v}, AYER {v}. TOMO {m} {y}",
            "Hipertenso {y}, tomo {m}.\n{d}: {v}\n{d}: {v}",
            "en recepción me dijeron que marque a {l} y que el {o} cuesta {a}",
            "Nací {y}, peso {v}. ¿Puedo tomar {m}? El {o} lo tengo aquí 🙏",
        ]
        return self.fill(self.pick(templates))

    def phi_message(self) -> list[Segment]:
        templates = [
            "Hola doctora, soy la mamá de Sofi. Mi cel es {p}, me puede llamar después de las {t}?",
            "buenas tardes, cambié de número, ahora es el {p} 🙏 y mi correo {e}",
            "La receta dice {p} pero ya no contestan. Tomo {m}",
            "whatsapp {p}\ncorreo: {e}\n{i}",
            "Mi CURP es {c} y me salió {v}. Gracias",
            "Le dejo mis datos para la factura: {r}, correo {e}, tel. {p}",
            "Para el IMSS: {s}. Mi cita fue el {d}",
            "mi correo es {e} 😊 ahí mándeme los resultados del {d}",
            "Doctor marque al {p} o al {p}, es de mi hijo. Pagamos {a}",
            "ESTOY EN {l}. LLAMEN A MI ESPOSA {p}",
            "Datos del paciente:\nCURP {c}\n{s}\nTel {p}\nCita {d} {t}",
            "hola!! soy yo otra vez, el número de mi hermana en Estados Unidos es {f} "
            "por si no me encuentran",
            "Me pueden mandar la receta a {e}? tomo {m} y {v}",
            "para la aseguradora: {r} / {s}, {o}",
            "Le marqué al consultorio desde el {p} pero no contestan, ¿me regresan la llamada? {v}",
            "Mi hija vive en España, su cel {f}. Mi curp: {c}",
            "El {d} me dieron {m}; cualquier cosa a {e} o al {p}",
            "mi cel: {p}.",
            "Le paso el teléfono de mi mamá ({p}) y el mío {p}, ella vive en {l}",
            "correo {e}.\ntel {p} (casa)\n{o}",
            "Soy diabético {y}, {v}. Mis datos: {c} / {p} / {e}",
            "Me cambié de correo, ya no uso el anterior, ahora es {e}. Pagué {a} el {d}",
        ]
        return self.fill(self.pick(templates))

    def identifier(self, slot: str) -> list[Segment]:
        if slot == "p":
            return [self.phone()]
        if slot == "f":
            return [self.foreign_phone()]
        if slot == "e":
            return [self.email()]
        if slot == "c":
            return [self.curp()]
        if slot == "r":
            cue, segment = self.rfc()
            return [("text", cue, None, None), segment]
        if slot == "i":
            return self.identifier(self.pick(["c", "r", "s"]))
        if slot == "s":
            cue, segment = self.nss()
            if not cue and not self.valid_nss(segment[3] or ""):
                cue = "NSS "
            return [("text", cue, None, None), segment]
        return [("text", slot, None, None)]

    def valid_nss(self, digits: str) -> bool:
        return nss_check_digit(digits[:10]) == digits[10]

    def fill(self, template: str) -> list[Segment]:
        segments: list[Segment] = []
        rest = template
        while "{" in rest:
            before, _, after = rest.partition("{")
            slot, _, rest = after.partition("}")
            segments.append(("text", before, None, None))
            noise = {
                "d": self.date,
                "t": self.time,
                "a": self.amount,
                "m": self.dose,
                "v": self.vitals,
                "l": self.place,
                "o": self.folio,
                "y": self.year,
            }.get(slot)
            if noise is not None:
                segments.append(("noise", noise(), None, None))
            else:
                segments.extend(self.identifier(slot))
        segments.append(("text", rest, None, None))
        return segments

    def typo(self, text: str) -> str:
        """Swap two letters, drop an accent or double a letter in one word."""
        words = text.split(" ")
        candidates = [i for i, word in enumerate(words) if len(word) > 4 and word.isalpha()]
        if not candidates:
            return text
        i = self.pick(candidates)  # type: ignore[arg-type]
        word = words[i]
        choice = self.rng.randint(0, 2)
        if choice == 0:
            j = self.rng.randint(1, len(word) - 2)
            word = word[:j] + word[j + 1] + word[j] + word[j + 2 :]
        elif choice == 1:
            word = word.translate(str.maketrans("áéíóú", "aeiou"))
        else:
            j = self.rng.randint(1, len(word) - 1)
            word = word[:j] + word[j] + word[j:]
        words[i] = word
        return " ".join(words)

    def render(self, segments: list[Segment]) -> tuple[str, list[list[object]]]:
        segments = [
            (k, self.typo(t) if k == "text" and self.rng.random() < 0.3 else t, c, v)
            for k, t, c, v in segments
        ]
        if self.rng.random() < 0.4:
            segments.append(("text", " " + self.pick(EMOJI), None, None))
        if self.rng.random() < 0.2:
            segments.insert(0, ("text", self.pick(EMOJI) + " ", None, None))
        case = self.rng.random()
        text, spans = "", []
        for kind, piece, category, value in segments:
            if case < 0.1:
                piece = piece.upper() if len(piece.upper()) == len(piece) else piece
            elif case < 0.2:
                piece = piece.lower() if len(piece.lower()) == len(piece) else piece
            if kind == "phi":
                spans.append([len(text), len(text) + len(piece), category, value])
            text += piece
        return text, spans


def build(seed: int = SEED) -> list[dict[str, object]]:
    generator = Generator(seed)
    rows: list[dict[str, object]] = []
    for index in range(MESSAGES_PER_KIND * 2):
        kind = "phi" if index % 2 == 0 else "clean"
        segments = generator.phi_message() if kind == "phi" else generator.clean_message()
        text, spans = generator.render(segments)
        rows.append({"id": index, "kind": kind, "text": text, "spans": spans})
    return rows


def serialise(rows: list[dict[str, object]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail if the checked-in corpus differs")
    parser.add_argument(
        "--seed",
        type=int,
        help="write a fresh corpus from another seed to --output instead (a held-out set: "
        "the checked-in corpus is what the recognisers were developed against)",
    )
    parser.add_argument("--output", type=Path, help="where --seed writes")
    args = parser.parse_args()
    if args.seed is not None:
        if args.output is None:
            parser.error("--seed needs --output")
        args.output.write_text(serialise(build(args.seed)), encoding="utf-8")
        print(f"wrote {args.output} from seed {args.seed}")
        return
    content = serialise(build())
    if args.check:
        if CORPUS.read_text(encoding="utf-8") != content:
            sys.exit(f"{CORPUS} differs from what the generator makes")
        print(f"{CORPUS.relative_to(ROOT)} is up to date")
        return
    CORPUS.parent.mkdir(parents=True, exist_ok=True)
    CORPUS.write_text(content, encoding="utf-8")
    print(f"wrote {CORPUS.relative_to(ROOT)}: {content.count(chr(10))} messages")


if __name__ == "__main__":
    main()

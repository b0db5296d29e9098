"""Categories, normalisation and surface ranking of PHI values.

Two spellings of one value ("  MARÍA   López " and "maria lopez") must normalise to the
same string, because the normalised form (through its HMAC) is what identifies a value
within a conversation. What the patient wrote is kept apart as the *surface*.
"""

from __future__ import annotations

import math
import unicodedata
from decimal import Decimal
from typing import Any

import phonenumbers
from django.views.decorators.debug import sensitive_variables

from nexus_workflows.conf import app_settings
from nexus_workflows.phi.exceptions import InvalidCategory, InvalidPhiValue
from nexus_workflows.phi.recognizers import canonical_email, canonical_phone

CATEGORIES = ("PERSONA", "TELEFONO", "EMAIL", "ID")

_ALLOWED_CATEGORIES = ", ".join(CATEGORIES)


def check_category(category: Any) -> str:
    if isinstance(category, str) and category in CATEGORIES:
        return category
    # Never the value: a value passed where the category goes (arguments swapped) is PHI.
    raise InvalidCategory(
        f"unknown PHI category (a {type(category).__name__}, not shown); allowed: "
        f"{_ALLOWED_CATEGORIES}, in capitals"
    )


def value_text(value: Any, category: str) -> str:
    """The value as text: strings as they are, numbers as their text.

    Raises :class:`InvalidPhiValue` for ``None``, booleans, other types, non-finite
    numbers and blank strings. The message names the category and the rule only.
    """
    if value is None:
        raise InvalidPhiValue(f"{category} value is None; pass a non-empty string or a number")
    if isinstance(value, str):
        text = value
        if not text.isascii() and not is_valid_unicode(text):
            raise InvalidPhiValue(
                f"{category} value is not valid Unicode (it has a lone surrogate); pass text that "
                "can be encoded as UTF-8"
            )
    elif isinstance(value, bool):
        raise InvalidPhiValue(f"{category} value is a bool; pass a non-empty string or a number")
    elif isinstance(value, int | float | Decimal):
        text = _number_text(value, category)
    else:
        raise InvalidPhiValue(
            f"{category} value is a {type(value).__name__}; pass a non-empty string or a number"
        )
    if not text.strip():
        raise InvalidPhiValue(f"{category} value is empty or only whitespace")
    if len(text) > VALUE_MAX_LENGTH:
        raise InvalidPhiValue(
            f"{category} value has {len(text):,} characters; a value has at most "
            f"{VALUE_MAX_LENGTH:,} (a name, a phone number, an address or an ID is far shorter)"
        )
    return text


#: The longest value a token stands for: an e-mail address has at most 254 characters,
#: and the bound keeps a megabyte pasted by mistake out of the maps (and their cache).
VALUE_MAX_LENGTH = 1000


#: Numbers given as values may have at most this many digits before the decimal point
#: (phone numbers and IDs have far fewer; a bound keeps huge ones from costing time).
NUMBER_MAX_DIGITS = 64
_NUMBER_LIMIT = 10**NUMBER_MAX_DIGITS


def is_valid_unicode(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8, i.e. has no lone surrogate."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _number_text(value: int | float | Decimal, category: str) -> str:
    """A number as the text it stands for; bounded before anything is converted."""
    rule = f"pass a finite number of at most {NUMBER_MAX_DIGITS} digits, or a string"
    if isinstance(value, Decimal):
        # is_finite, not math.isfinite: float(Decimal("sNaN")) raises.
        if not value.is_finite():
            raise InvalidPhiValue(f"{category} value is not a finite number; {rule}")
        if value and value.adjusted() >= NUMBER_MAX_DIGITS:
            raise InvalidPhiValue(f"{category} value is too large; {rule}")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidPhiValue(f"{category} value is not a finite number; {rule}")
        if abs(value) >= _NUMBER_LIMIT:
            raise InvalidPhiValue(f"{category} value is too large; {rule}")
    elif not -_NUMBER_LIMIT < value < _NUMBER_LIMIT:
        raise InvalidPhiValue(f"{category} value is too large; {rule}")
    if isinstance(value, int):
        return str(value)
    # 5512345678.0 is the number 5512345678, not a string with a decimal point.
    return str(int(value)) if value == int(value) else str(value)


def _fold_persona(text: str) -> str:
    # casefold first: some letters fold into a letter plus a combining mark ("İ").
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    stripped = "".join(char for char in decomposed if not unicodedata.combining(char))
    return " ".join(stripped.split())


def _fold_phone(text: str) -> str:
    region = app_settings.PHI_DEFAULT_REGION
    # What encode_text finds ("044 55 1234 5678", "+52 1 55…") has the recogniser's value,
    # so every spelling of one number is one value; anything else is parsed as before.
    canonical = canonical_phone(text, region)
    if canonical is not None:
        return canonical
    try:
        number = phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        raise InvalidPhiValue(
            f"TELEFONO value is not a phone number (parsed with default region {region!r})"
        ) from None
    if not phonenumbers.is_possible_number(number):
        raise InvalidPhiValue(
            f"TELEFONO value does not have the length of a phone number (default region {region!r})"
        )
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)


def _fold_email(text: str) -> str:
    # "maria arroba gmail punto com" is maria@gmail.com, as encode_text finds it.
    canonical = canonical_email(text)
    return canonical if canonical is not None else text.strip().casefold()


def _fold_id(text: str) -> str:
    return "".join(char for char in text if char.isalnum()).upper()


_FOLDERS = {
    "PERSONA": _fold_persona,
    "TELEFONO": _fold_phone,
    "EMAIL": _fold_email,
    "ID": _fold_id,
}


def normalize_text(text: str, category: str) -> str:
    """Normalise an already validated value; raises if nothing is left."""
    normalized = _FOLDERS[category](text)
    if not normalized:
        raise InvalidPhiValue(f"{category} value normalises to nothing (no letters or digits are left)")
    return normalized


@sensitive_variables()  # as encode's: the value is patient data
def normalize(value: Any, category: str) -> str:
    """The normalised form of ``value`` in ``category``.

    PERSONA: Unicode-normalised, accents and case folded, whitespace collapsed.
    TELEFONO: E.164, parsed with ``PHI_DEFAULT_REGION`` for numbers without a country code
    (Mexican prefixes such as 044 and "+52 1" dropped, as ``encode_text`` finds them).
    EMAIL: trimmed and case-folded; a spelled-out address ("maria arroba gmail punto com")
    as the address it spells. ID: separators (anything not a letter or digit)
    removed, upper-cased.
    """
    category = check_category(category)
    return normalize_text(value_text(value, category), category)


def surface_form(text: str) -> str:
    """What is stored (encrypted) and decoded back: NFC and trimmed.

    Inner whitespace is kept as written ("55\u00a01234\u00a05678" as pasted), so that
    ``decode(encode_text(x))`` gives ``x`` back exactly; :func:`richness` ignores it.
    """
    return unicodedata.normalize("NFC", text).strip()


def richness(surface: str) -> tuple[int, bool, int]:
    """How rich a surface is: accented letters, then mixed case, then length.

    Tuples compare in that order, so a surface replaces the stored one only when its
    richness is strictly greater. Whitespace runs count as one space: "María  López" is
    no richer than "María López".
    """
    surface = " ".join(surface.split())
    if surface.isascii():
        accents = 0
    else:
        accents = sum(1 for char in unicodedata.normalize("NFD", surface) if unicodedata.combining(char))
    mixed_case = surface != surface.lower() and surface != surface.upper()
    return accents, mixed_case, len(surface)


def is_richer(candidate: str, current: str) -> bool:
    return candidate != current and richness(candidate) > richness(current)

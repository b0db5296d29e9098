"""Recognisers of the identifiers Mexican patients write in free Spanish text.

One recogniser per category, each returning :class:`Detection` spans (start, end,
category, normalised value), and :func:`resolve`, which merges them with the caller's
spans deterministically. ``encode_text`` calls :func:`find` through ``find_spans``.

- **TELEFONO**: ``phonenumbers.PhoneNumberMatcher`` with ``Leniency.VALID`` (the number
  must be a valid number of its country; ``POSSIBLE`` takes dates such as
  ``12-05-2024 10`` for numbers, and the grouping leniencies refuse the groupings
  patients use, such as ``55-12-34-56-78``). The matcher runs on short windows around
  digit runs, never on the whole message (on 500 characters it costs ~1.7 ms), with our
  own pre-normalisation where it cannot cope: Unicode digits and spaces mapped one
  character to one character (so offsets stay those of the original), and the Mexican
  prefixes ``044``/``045``/``01``/``1``/``52 1`` blanked out. A national number must also
  be grouped the way phone numbers are written (see :func:`_plausible_grouping`), which
  keeps lists of lab values such as ``98 102 95 110`` out. Then, for a number no phone cue
  word announces, context (:mod:`.clinical`): a list of values after a clinical label or
  before a unit (``FC 91 88 90 84 73``), or a folio written with ``00``/``09`` in one piece.
- **EMAIL**: a permissive pattern finds candidates, written or spelled out (``arroba``,
  ``punto``, ``(at)``, ``[dot]``, spaces around ``@`` and ``.``); ``email-validator``
  validates the compact address. Spelled-out or spaced forms must end in a known
  top-level domain.
- **ID**: CURP, RFC (persons and companies), the INE voter key and the IMSS NSS: patterns
  find candidates, ``python-stdnum`` checks dates, state codes and check digits; see
  :func:`find_ids` for which checks decide.

Detected spans never cross a line break. Everything here is pure computation: no
database, no logging of values.
"""

# Long module: mostly data: one recognizer table per category of identifier.

from __future__ import annotations

import bisect
import datetime
import itertools
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import phonenumbers
from email_validator import EmailNotValidError, validate_email
from phonenumbers import Leniency, PhoneNumberMatcher
from stdnum import luhn
from stdnum.exceptions import ValidationError
from stdnum.mx import curp, rfc

from nexus_workflows.phi.clinical import clinical_series, reference_number

#: Tie-break between detections of equal length starting at the same place.
CATEGORY_ORDER = ("EMAIL", "ID", "TELEFONO", "PERSONA")
_CATEGORY_RANK = {category: rank for rank, category in enumerate(CATEGORY_ORDER)}


@dataclass(frozen=True, slots=True)
class Detection:
    """An identifier found in a text: ``text[start:end]``, its category and normalised value.

    ``cued`` says that a word announcing this category ("tel", "CURP", …) stands just
    before it; it breaks ties between detections of one span.
    """

    start: int
    end: int
    category: str
    value: str = field(repr=False)  # the identifier itself: out of the repr (tracebacks, logs)
    cued: bool = False


# --- shadow text -------------------------------------------------------------------------
# The recognisers read a "shadow" of the text: the same length, with Unicode digits,
# spaces, dashes and full-width symbols mapped to their ASCII form, one character for one
# character, so every offset found in the shadow is an offset of the original.

_FIXED = {
    "\uff0b": "+",
    "\uff20": "@",
    "\uff08": "(",
    "\uff09": ")",
    "\uff0e": ".",
    "\u2010": "-",
    "\u2011": "-",
    "\u2012": "-",
    "\u2013": "-",
    "\u2014": "-",
    "\u2212": "-",
    "\uff0d": "-",
}


@lru_cache(maxsize=2048)
def _shadow_char(char: str) -> str:
    """The ASCII stand-in of one non-ASCII character (itself when it has none).

    Bounded, unlike a growing table: a message may hold any character of Unicode.
    """
    mapped = _FIXED.get(char)
    if mapped is not None:
        return mapped
    digit = unicodedata.decimal(char, None)
    if digit is not None:
        return str(digit)
    if char not in "\x85\u2028\u2029" and char.isspace():
        return " "
    return char


_NON_ASCII = re.compile(r"[^\x00-\x7f]")


def shadow(text: str) -> str:
    """``text`` with Unicode digits, spaces and dashes in ASCII, at the same offsets."""
    # A message has a few accents and emoji: mapping only those beats str.translate.
    return text if text.isascii() else _NON_ASCII.sub(lambda match: _shadow_char(match.group()), text)


def _lower(text: str) -> str:
    """``text`` in lower case at the same offsets (a few letters lower to two characters)."""
    lowered = text.lower()
    return lowered if len(lowered) == len(text) else "".join(char.lower()[:1] for char in text)


def _upper(text: str) -> str:
    upper = text.upper()
    return upper if len(upper) == len(text) else "".join(char.upper()[:1] for char in text)


def _cued(lowered: str, start: int, cue: re.Pattern[str]) -> bool:
    """Whether ``cue`` ends within the 30 characters before ``start`` (same line)."""
    window = lowered[max(0, start - 30) : start]
    window = window.rsplit("\n", 1)[-1]
    return cue.search(window) is not None


def _windowed(
    pattern: re.Pattern[str], shade: str, anchor: re.Pattern[str], *, before: int, after: int
) -> list[re.Match[str]]:
    """The matches of ``pattern`` near the matches of the cheap ``anchor``.

    Running a pattern with lookbehinds and alternations over a whole message costs
    hundreds of microseconds; around the few places that can hold a match it costs a few.
    A match that touches a window's cut end is retried without the cut.
    """
    windows: list[list[int]] = []
    for hit in anchor.finditer(shade):
        start, end = max(0, hit.start() - before), min(len(shade), hit.end() + after)
        if windows and start <= windows[-1][1]:
            windows[-1][1] = max(windows[-1][1], end)
        else:
            windows.append([start, end])
    matches: list[re.Match[str]] = []
    for start, end in windows:
        for match in pattern.finditer(shade, start, end):
            if match.end() == end < len(shade):
                retried = pattern.match(shade, match.start())
                if retried is None:
                    continue
                match = retried
            if not matches or match.start() >= matches[-1].end():
                matches.append(match)
    return matches


# --- phones --------------------------------------------------------------------------------

# A run of digits joined by phone separators (never a line break, a comma, a slash or a
# colon: those separate dates, times, amounts and lists), optionally after "+".
# (It starts with a digit so that the regex engine can skip ahead fast; a "(" and "+"
# before it are taken in by find_phones.)
_PHONE_RUN = re.compile(r"[0-9](?:[ \t.\-()]{0,3}[0-9]){6,}")
# What may stand between a cue word and the identifier: "mi CURP es …", "tel. del paciente: …".
_CUE_TAIL = r"[\w.]*(?:[\s:#.\-]+(?:es|era|son|de|del|la|el|mi|su|paciente|n[uú]mero|no\.?))*[\s:#.\-]*$"
_PHONE_CUE = re.compile(
    r"(?:tel|tél|cel|whats|wsp|wa|lada|llam|marc|num|núm|no\.|movil|móvil|fijo|contacto|"
    r"telefono|teléfono|celular|phone)" + _CUE_TAIL
)
# Words a number may be glued to ("cel5512345678") and still be a phone number.
_GLUED_CUE = re.compile(
    r"(?:tel|cel|whatsapp|wa|numero|número|num|movil|móvil|fijo|celular|telefono|teléfono)$"
)
_TIME_AFTER = re.compile(r":[0-5][0-9]")
# A unit glued to a number ("110mg", "5ml", "72lpm", "3x"): that group is a quantity. Any
# other word glued to it ("5512345678hola", "55 1234 5678gracias") leaves the number whole.
_UNIT_AFTER = re.compile(
    r"(?:mg|mgs|mcg|µg|ug|g|gr|grs|kg|ml|cc|l|lt|lts|dl|ui|u|mu|mui|mmol|meq|mmhg|cm|mm|m|mts|km|"
    r"h|hr|hrs|hs|min|mins|seg|s|lpm|bpm|rpm|x|pz|pzs|tab|tabs|caps|cap|gts|gotas|am|pm|"
    r"años|anos|año|ano|d|dias|días|sem|semanas|meses|mes|kcal|cal|k|mil|pesos|mxn|usd|"
    r"ra|er|ro|vo|mo|to|°|º|ª)(?![^\W\d_])"
)
_MIN_PHONE_DIGITS = 7
# What stands between two runs when they are two numbers side by side, not a fraction or a
# date: a slash ("55-1234-5678/55-8765-4321", "…5678 / +52 55…", "…5678/(55) 8765…"), or a
# conjunction glued to the next one ("5512345678ó5587654321", "55 1234 5678 y/o55 8765 4321").
_SLASH_BETWEEN = re.compile(r"[ \t]*/{1,2}[ \t]*(?:\+[ \t]?)?\(?")
_GLUED_CONJUNCTION = re.compile(r"[ \t]*(?:[oOóÓyY]|[yY]/[oO])")
# A digit before a slash just before a run: "12/05/2024 …", "120/80 …" (a fraction or a
# date), not "casa/55 1234 5678" nor "(cel)/55 1234 5678".
_DIGIT_THEN_SLASH = re.compile(r"[0-9][ \t]{0,3}/$")
# A phone number ends in a group of four digits or more (55 1234 5678, 998 123 4567);
# a fraction's numerator, a day, a month or a dose before a slash has fewer.
_MIN_LAST_GROUP_BEFORE_SLASH = 4
# ... unless it is the year of a date written year first ("2017/3/18", "2024/05/12").
_MONTH_DAY_AFTER = re.compile(r"/[0-9]{1,2}/[0-9]{1,2}(?![0-9])")
# Longest window handed to the matcher: "+52 1 (55) 1234-5678 ext" and a little more.
_MAX_WINDOW_DIGITS = 20


_DIGIT_GROUP = re.compile(r"[0-9]+")


def _digit_groups(raw: str) -> list[int]:
    return [len(group) for group in _DIGIT_GROUP.findall(raw)]


def _plausible_grouping(groups: list[int], national_length: int, area_length: int) -> bool:
    """Whether the digit groups of a national number are grouped as phone numbers are.

    ``groups`` are the lengths of the digit groups of the whole match; the leading digits
    beyond the national number (a country code written without "+") are dropped first.
    Accepted: one group; pairs (55 12 34 56 78) or single digits throughout; 3-3-4 and
    2-4-4 (the usual ways, whatever the area code); or the area code as its own group
    followed by one group or groups of 2 to 4 digits.
    """
    extra = sum(groups) - national_length
    trimmed = list(groups)
    while extra > 0 and trimmed:
        if trimmed[0] <= extra:
            extra -= trimmed.pop(0)
        else:
            trimmed[0] -= extra
            extra = 0
    if len(trimmed) <= 1:
        return True
    if all(size == 2 for size in trimmed) or all(size == 1 for size in trimmed):
        return True
    if trimmed in ([3, 3, 4], [2, 4, 4]):
        return True
    if area_length and trimmed[0] == area_length:
        local = trimmed[1:]
        return len(local) == 1 or all(2 <= size <= 4 for size in local)
    return False


def _blank_mexican_prefix(window: str) -> tuple[str, int, int]:
    """Blank the prefixes Mexicans dial that ``phonenumbers`` does not strip.

    Returns the window with the prefix digits replaced by spaces, and where a leading
    prefix starts and ends (0, 0 when nothing leading was blanked). 044/045 (old mobile from a landline)
    and 01 (old long distance) before ten digits; 1 before ten digits (old mobile from
    abroad, "1 55 1234 5678"); and the 1 after the country code in "+52 1" / "521".
    """
    positions = [index for index, char in enumerate(window) if char.isdigit()]
    digits = "".join(window[index] for index in positions)
    blank: list[int] = []
    if len(digits) == 13 and digits.startswith(("044", "045")):
        blank = positions[:3]
    elif len(digits) == 12 and digits.startswith("01"):
        blank = positions[:2]
    elif len(digits) == 11 and digits.startswith("1") and not window.startswith("+"):
        blank = positions[:1]
    elif len(digits) == 13 and digits.startswith("521"):
        blank = positions[2:3]
    elif len(digits) == 15 and digits.startswith("00521"):
        blank = positions[4:5]
    if not blank:
        return window, 0, 0
    # The prefix is a group of its own ("044 55…", "52 1 55…", "521 55…") or the number is
    # written in one piece ("0445512345678"): "133 154 115 99" is a list, not 1 + 33….
    after = blank[-1] + 1
    if window[after : after + 1].isdigit() and len(_digit_groups(window)) > 1:
        return window, 0, 0
    # It is part of the number only when one separator at most, and maybe the area code's
    # opening parenthesis, follows it: "044 (55)", "01-55", not "1. 55".
    gap = window[after : positions[positions.index(blank[-1]) + 1]]
    if len(gap.removesuffix("(")) > 1:
        return window, 0, 0
    chars = list(window)
    for index in blank:
        chars[index] = " "
    leading = blank[0] == positions[0]
    return "".join(chars), (blank[0] if leading else 0), (after if leading else 0)


@lru_cache(maxsize=4096)
def _phones_in_window(window: str, region: str) -> tuple[tuple[int, int, str], ...]:
    """(start, end, E.164) of the phone numbers in one window of shadow text.

    Pure function of its arguments, so it is memoised: a conversation repeats its numbers.
    """
    prepared, prefix_start, prefix_end = _blank_mexican_prefix(window) if region == "MX" else (window, 0, 0)
    found = []
    for match in PhoneNumberMatcher(prepared, region, leniency=Leniency.VALID):
        raw = match.raw_string
        number = match.number
        if not raw.lstrip("(").startswith(("+", "00")):
            national = phonenumbers.national_significant_number(number)
            area = phonenumbers.length_of_national_destination_code(number)
            if not _plausible_grouping(_digit_groups(raw), len(national), area):
                continue
        start = match.start
        if raw.startswith("(") and raw.count("(") > raw.count(")"):
            start += 1  # "(55 1234 5678)": the parenthesis encloses the number, not its area code
        if prefix_end and window[prefix_end:start].strip(" .-") == "":
            start = prefix_start  # the prefix is part of what the patient wrote
        value = phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)
        found.append((start, match.end, value))
    return tuple(found)


# Where a window may start or end: spaces before a group, or a dash or dot between two
# groups of seven digits or more ("5512345678-5587654321"). No number is grouped so: two
# numbers are, each written in one piece, and no window crosses that dash.
_WINDOW_SEPARATOR = re.compile(r" +(?=[+(0-9])|(?<=[0-9]{7})(?P<between>[-.])(?=[0-9]{7})")


def _windows(run: str, skip_first: bool, skip_last: bool) -> list[tuple[int, int]]:
    """Where to try the matcher in a run: every stretch of whole space-separated groups
    holding 7 to ``_MAX_WINDOW_DIGITS`` digits, by start, the longest first. So a year or an
    amount glued to a number ("2024 55 1234 5678") is dropped, and numbers written one after
    another ("55 1234 5678 33 3616 1234", or after a list of lab values) are each found —
    not only the ones at the run's ends. ``skip_first``/``skip_last``: the first or last group
    belongs to what stands next to the run (a date, an amount, a time, a unit)."""
    separators = list(_WINDOW_SEPARATOR.finditer(run))
    between = [match.start() for match in separators if match.group("between")]
    starts = [0, *(match.end() for match in separators)]
    ends = [*(match.start() for match in separators), len(run)]
    if skip_first:
        starts = starts[1:]
    if skip_last:
        ends = ends[:-1]
    # The run's ends, as far as a glued year, amount or unit reaches: a window there is
    # taken on the grouping check alone. A window inside the run (a number between other
    # numbers) must also be written as numbers are: a group of four digits or more, or
    # five pairs — lists of lab values ("98 102 95 110") have neither.
    outer_starts, outer_ends = set(starts[:4]), set(ends[-3:])
    long_groups, five_pairs = _NextMatch(_LONG_GROUP, run), _NextMatch(_FIVE_PAIRS_AHEAD, run)
    windows: list[tuple[int, int]] = []
    # Digits before each position, so that a window's count is one subtraction.
    digits_before = list(itertools.accumulate(map(str.isdigit, run), initial=0))
    for start in starts:
        # From the first end after this start (ends are in order): walking every earlier
        # end for every start took time in the square of the run's groups.
        first = bisect.bisect_right(ends, start)
        if start not in outer_starts:
            # A window from an inner start must pass the grouping check: the ends before the
            # first that can are skipped unseen, and once no window can from here on, the
            # later starts (all inner) are too. In "5 5 5 …" or "1 2 3 … 0", that is all.
            long = long_groups.at(start)
            if long is None and five_pairs.at(start) is None:
                break
            first = max(first, _first_grouped_end(run, ends, start, long))
            if first == len(ends):
                continue
        # The dash or dot between two numbers after this start, if any: no window crosses it.
        at = bisect.bisect_left(between, start)
        limit = between[at] if at < len(between) else len(run)
        fitting: list[tuple[int, int]] = []
        for index in range(first, len(ends)):
            end = ends[index]
            digits = digits_before[end] - digits_before[start]
            if digits > _MAX_WINDOW_DIGITS or end > limit:
                break  # longer windows only add digits; a run of lab values stays linear
            if digits < _MIN_PHONE_DIGITS:
                continue
            if start not in outer_starts or end not in outer_ends:
                groups = _digit_groups(run[start:end])
                if max(groups) < 4 and groups != [2, 2, 2, 2, 2]:
                    continue
            fitting.append((start, end))
        windows.extend(reversed(fitting))
    return windows


# The first group of four digits or more from a place between groups; five groups of two
# digits in a row from there, or anywhere after.
_LONG_GROUP = re.compile(r"[0-9]{4,}")
_FIVE_PAIRS = re.compile(r"[^0-9]*(?:[0-9]{2}[^0-9]+){4}[0-9]{2}(?![0-9])")
_FIVE_PAIRS_AHEAD = re.compile(r"(?<![0-9])(?:[0-9]{2}[^0-9]+){4}[0-9]{2}(?![0-9])")


class _NextMatch:
    """The first match of a pattern at or after positions asked for in order: searched again
    only once passed, so one scan of the text in all, however many positions."""

    def __init__(self, pattern: re.Pattern[str], text: str) -> None:
        self.pattern, self.text = pattern, text
        self.match: re.Match[str] | None = None
        self.valid_to = -1  # the positions up to here have self.match as theirs

    def at(self, position: int) -> re.Match[str] | None:
        if position > self.valid_to:
            self.match = self.pattern.search(self.text, position)
            self.valid_to = len(self.text) if self.match is None else self.match.start()
        return self.match


def _first_grouped_end(run: str, ends: list[int], start: int, long: re.Match[str] | None) -> int:
    """The index in ``ends`` of the first end at which a window from ``start`` (a place
    between groups) holds ``long``, the next group of four digits or more, or is exactly five
    pairs; ``len(ends)`` when there is none. No end cuts a group."""
    earliest = len(ends) if long is None else bisect.bisect_left(ends, long.end())
    pairs = _FIVE_PAIRS.match(run, start)
    if pairs is not None:
        earliest = min(earliest, bisect.bisect_left(ends, pairs.end()))
    return earliest


def _numbers_side_by_side(shade: str, runs: list[re.Match[str]]) -> list[bool]:
    """For each pair of consecutive runs, whether what stands between them says "two numbers":
    a slash (with spaces, the next number's "+" or "(") or a conjunction glued to the next."""
    return [
        _SLASH_BETWEEN.fullmatch(shade, left.end(), right.start()) is not None
        or _GLUED_CONJUNCTION.fullmatch(shade, left.end(), right.start()) is not None
        for left, right in itertools.pairwise(runs)
    ]


# A slash is a fraction's or a date's only with short groups on both sides: not when
# another number stands across it ("55-1234-5678/55-8765-4321"), nor next to a group of
# seven digits or more ("wa.me/5215512345678"), nor after a group of four or more (a
# phone's last: "55 1234 5678/79", "55 1234 5678/cel"), nor before a run when no digit
# stands before the slash ("(casa)/55 8765 4321").
def _fraction_before(shade: str, start: int, first_group: int, number_before: bool) -> bool:
    """Whether the slash just before a run starting at ``start`` ends a fraction or a date
    ("12/05/2024 5512345678", "120/80 55 1234 5678"), so the run's first group is theirs."""
    return (
        first_group < _MIN_PHONE_DIGITS
        and not number_before
        and _DIGIT_THEN_SLASH.search(shade, max(0, start - 5), start) is not None
    )


def _fraction_after(shade: str, end: int, last_group: int, number_after: bool) -> bool:
    """Whether the slash just after a run ending at ``end`` starts a fraction, a date or a
    dose ("55 1234 5678 1/2", "… 2/día", "… 2017/3/18"), so the run's last group is theirs."""
    if number_after:
        return False
    return last_group < _MIN_LAST_GROUP_BEFORE_SLASH or _MONTH_DAY_AFTER.match(shade, end) is not None


def find_phones(text: str, region: str, *, shadowed: str | None = None) -> list[Detection]:
    """Phone numbers in ``text``; numbers without a country code are read in ``region``."""
    shade = shadow(text) if shadowed is None else shadowed
    lowered: str | None = None
    found: list[Detection] = []
    runs = list(_PHONE_RUN.finditer(shade))  # runs of seven digits or more
    # A run of seven digits or more on the other side is a number, not a fraction or a date.
    side_by_side = [False, *_numbers_side_by_side(shade, runs), False]
    code_before = False  # the previous run was part of a code: "A5512345678y5587654321" is one
    for index, run in enumerate(runs):
        number_before, number_after = side_by_side[index], side_by_side[index + 1]
        start, end = _with_opening(shade, run.start()), run.end()
        raw = shade[start:end]
        before = shade[start - 1] if start else ""
        after = shade[end] if end < len(shade) else ""
        if lowered is None:
            lowered = _lower(shade)  # the shadow's digits and spaces: the context rules read them
        glued_to_number = number_before and not code_before  # "5512345678ó5587654321"
        code_before = (
            before.isalpha()
            and not glued_to_number
            and not _GLUED_CUE.search(lowered[max(0, start - 12) : start])
        )
        if code_before:
            continue  # part of a code such as "A5512345678"
        # An amount, a percentage or the end of a fraction before; a unit ("mg"), a
        # fraction or a time ("2024-05-12 10:30") after: that group is not the phone's.
        groups = _digit_groups(raw)
        skip_first = shade[max(0, start - 2) : start].strip().endswith("$") or (
            before == "%" or (before == "/" and _fraction_before(shade, start, groups[0], number_before))
        )
        skip_last = (
            (after.isalpha() and _UNIT_AFTER.match(lowered, end) is not None)
            or after == "%"
            or (after == "/" and _fraction_after(shade, end, groups[-1], number_after))
            or _TIME_AFTER.match(shade, end) is not None
        )
        found.extend(_phones_in_run(lowered, raw, start, _windows(raw, skip_first, skip_last), region))
    return found


def _with_opening(shade: str, start: int) -> int:
    """Where a run starting at ``start`` starts with the "(" and "+" before it taken in."""
    if shade[start - 1 : start] == "(":
        start -= 1
    if shade[start - 1 : start] == "+":
        start -= 1
    elif shade[start - 2 : start] == "+ ":
        start -= 2
    return start


def _phones_in_run(
    lowered: str, raw: str, start: int, windows: list[tuple[int, int]], region: str
) -> list[Detection]:
    """The numbers the matcher finds in a run's ``windows``, none overlapping an earlier one."""
    found: list[Detection] = []
    taken_to = start
    for window_start, window_end in windows:
        if start + window_start < taken_to:
            continue
        window = raw[window_start:window_end]
        count = sum(char.isdigit() for char in window)
        if count > _MAX_WINDOW_DIGITS:
            continue
        if region == "MX" and count < 10 and not window.lstrip("(").startswith("+"):
            continue  # every Mexican number has ten digits; skip the matcher's cost
        for rel_start, rel_end, value in _phones_in_window(window, region):
            span_start, span_end = start + window_start + rel_start, start + window_start + rel_end
            if span_start < taken_to:
                continue
            cued = _cued(lowered, span_start, _PHONE_CUE)
            if not cued and region == "MX" and _value_or_folio(lowered, span_start, span_end):
                continue  # the next windows may still hold a number
            found.append(Detection(span_start, span_end, "TELEFONO", value, cued))
            taken_to = span_end
    return found


def _value_or_folio(lowered: str, start: int, end: int) -> bool:
    """Whether a number no phone cue announces is a list of clinical values ("FC 91 88 90
    84 73") or a folio written with the international prefix ("folio 0064867038")."""
    return clinical_series(lowered, start, end) or reference_number(lowered, start, end)


# --- e-mail addresses ----------------------------------------------------------------------

_SP = r"[ \t]"
_LOCAL_CHARS = r"[\w!#$%&'*+=?^`{|}~\u0300-\u036f-]+"


def _spelled(words: str) -> str:
    """A spelled-out separator: " arroba " between spaces, or "(at)" / "[punto]" in brackets."""
    bracketed = rf"{_SP}{{0,2}}[(\[{{<]{_SP}?(?:{words}){_SP}?[)\]}}>]{_SP}{{0,2}}"
    return rf"(?:{_SP}{{1,2}}(?:{words}){_SP}{{1,2}}|{bracketed})"


_SPELLED_AT = _spelled("arroba|at")
_SPELLED_DOT = _spelled("punto|dot")
_AT = rf"(?:{_SP}{{0,2}}@{_SP}{{0,2}}|{_SPELLED_AT})"
_DOT = rf"(?:{_SP}{{0,2}}\.{_SP}{{0,2}}|{_SPELLED_DOT})"
_LOCAL_JOIN = rf"(?:\.|{_SPELLED_DOT}|{_SP}{{1,2}}gui[oó]n(?:{_SP}bajo|{_SP}medio)?{_SP}{{1,2}})"
_LABEL = r"[^\W_](?:[\w-]{0,61}[^\W_])?"
# Matched against the lower-cased shadow, from the start of a word.
_EMAIL_CANDIDATE = re.compile(
    rf"(?<![\w.@+-]){_LOCAL_CHARS}(?:{_LOCAL_JOIN}{_LOCAL_CHARS})*{_AT}{_LABEL}(?:{_DOT}{_LABEL})+"
)
_WORD_START = re.compile(r"(?<![\w.@+-])[\w!#$%&'*+=?^`{|}~-]")
# Every address has one of these; str.find finds them faster than any regex.
_AT_ANCHORS = ("@", "arroba", "(at", "[at", "{at", "<at", " at ")
# How far before its "@" an address may start.
_LOCAL_REACH = 80
_SPELLED_WORD = re.compile(
    rf"{_SPELLED_AT}|{_SPELLED_DOT}|{_SP}*gui[oó]n{_SP}bajo{_SP}*|{_SP}*gui[oó]n(?:{_SP}medio)?{_SP}*"
    rf"|{_SP}*@{_SP}*|{_SP}*\.{_SP}*"
)
# Top-level domains a spelled-out or spaced address may end in: the generic ones and the
# country codes of the Americas and Europe that patients here use. A literal address
# (no spaces, "@" and ".") may end in any top-level domain.
_KNOWN_TLDS = frozenset({
    "com", "net", "org", "edu", "gob", "gov", "mil", "info", "biz", "io", "co", "mx", "us", "ca",
    "es", "ar", "cl", "pe", "ve", "ec", "bo", "py", "uy", "br", "gt", "hn", "sv", "ni", "cr", "pa",
    "cu", "do", "pr", "uk", "fr", "de", "it", "pt", "nl", "ch", "be", "at", "ie", "eu", "app", "dev",
    "me", "tv", "online", "site", "store", "email",
})  # fmt: skip


def _compact(spelled: str) -> str:
    """The address with its spelled-out or spaced separators written as symbols."""

    def symbol(match: re.Match[str]) -> str:
        word = match.group().strip(" \t()[]{}<>").lower()
        if word in ("@", "at", "arroba"):
            return "@"
        if word in (".", "dot", "punto"):
            return "."
        if "bajo" in word:
            return "_"
        return "-"

    return _SPELLED_WORD.sub(symbol, spelled)


@lru_cache(maxsize=4096)
def _validated_email(address: str) -> str | None:
    try:
        valid = validate_email(address, check_deliverability=False)
    except EmailNotValidError:
        return None
    # One token per address whatever its case: the local part is case-insensitive at every
    # provider patients use, and this is how addresses were normalised before.
    return valid.normalized.casefold()


def _trim_to_tld(candidate: str, spelled: bool) -> str | None:
    """Drop trailing labels until the address ends in an acceptable top-level domain.

    One pass over the dots, last first: re-scanning the candidate after each dropped
    label took time growing with the square of its length (seconds for a few thousand
    labels after an "@", which anyone can send)."""
    at = re.search(_AT, candidate)
    if at is None:
        return None
    end = len(candidate)
    dots = [piece for piece in re.finditer(_DOT, candidate) if piece.start() > at.end()]
    for dot in reversed(dots):
        tld = candidate[dot.end() : end].lower()
        if (tld in _KNOWN_TLDS) or (not spelled and tld.isalpha() and len(tld) >= 2):
            return candidate[:end]
        end = dot.start()
    return None


def _anchors(lowered: str, needles: tuple[str, ...]) -> list[int]:
    positions: list[int] = []
    for needle in needles:
        position = lowered.find(needle)
        while position != -1:
            positions.append(position)
            position = lowered.find(needle, position + 1)
    return sorted(positions)


def find_emails(text: str, *, shadowed: str | None = None) -> list[Detection]:
    """E-mail addresses in ``text``, written or spelled out.

    Only the words just before an "@" (or "arroba", "(at)"…) are tried as the start of an
    address: the candidate pattern is too costly to run over a whole message.
    """
    lowered = _lower(shadow(text) if shadowed is None else shadowed)
    found: list[Detection] = []
    covered = 0
    for anchor in _anchors(lowered, _AT_ANCHORS):
        if anchor < covered:
            continue
        begin = max(lowered.rfind("\n", 0, anchor) + 1, anchor - _LOCAL_REACH)
        for word in _WORD_START.finditer(lowered, begin, anchor + 1):
            match = _EMAIL_CANDIDATE.match(lowered, word.start())
            if match is None or match.end() <= anchor:
                continue
            candidate = match.group()
            spelled = not re.fullmatch(r"[^\s@]+@[^\s@]+", candidate)
            trimmed = _trim_to_tld(candidate, spelled)
            address = None if trimmed is None else _compact(trimmed) if spelled else trimmed
            # No address is longer than 254 characters; the memo keeps no longer text.
            value = None if address is None or len(address) > 254 else _validated_email(address)
            if trimmed is not None and value is not None:
                found.append(Detection(match.start(), match.start() + len(trimmed), "EMAIL", value))
                covered = match.start() + len(trimmed)
            break
    return found


# --- national IDs --------------------------------------------------------------------------

_CURP_STATES = (
    "AS|BC|BS|CC|CL|CM|CS|CH|DF|DG|GT|GR|HG|JC|MC|MN|MS|NT|NL|OC|PL|QT|QR|SP|SL|SR|TC|TS|TL|VZ|YN|ZS|NE"
)
_CURP = re.compile(
    rf"(?<![0-9A-ZÑ])([A-Z][AEIOUX][A-ZÑ]{{2}})[ -]?([0-9]{{6}})[ -]?([HM](?:{_CURP_STATES})"
    rf"[B-DF-HJ-NP-TV-ZÑ]{{3}}[0-9A-Z][0-9])(?![0-9A-ZÑ])"
)
_RFC = re.compile(r"(?<![0-9A-ZÑ&])([A-ZÑ&]{3,4})[ -]?([0-9]{6})(?:[ -]?([A-Z0-9]{2}[0-9A]))?(?![0-9A-ZÑ&])")
_NSS = re.compile(r"(?<![0-9])([0-9]{2}[ -]?[0-9]{2}[ -]?[0-9]{2}[ -]?[0-9]{4}[ -]?[0-9])(?![0-9])")
# The INE voter key (clave de elector, on every voting card): six letters from the names,
# the birth date (YYMMDD), the state of birth (01-32, 87/88 abroad), H/M and three digits.
_INE = re.compile(
    r"(?<![0-9A-ZÑ])([A-ZÑ]{6})[ -]?([0-9]{2})([0-9]{2})([0-9]{2})([0-9]{2})[ -]?([HM][0-9]{3})(?![0-9A-ZÑ])"
)
# Every ID has six digits in a row, or an NSS's first six digits in pairs.
_ID_HINT = re.compile(r"[0-9]{2}[ -]?[0-9]{2}[ -]?[0-9]{2}")
_RFC_CUE = re.compile(r"(?:r\.?f\.?c|registro federal(?: de contribuyentes)?)" + _CUE_TAIL)
# Stems, and up to three words of any kind after them, so that "número de seguro soical
# es" (a typo) and "NSS de mi esposo:" still count.
_NSS_CUE = re.compile(r"(?:nss|n\.s\.s|imss|segur|social|afili)[\w.]*(?:[\s:#.\-]+\w{1,12}){0,3}[\s:#.\-]*$")


def _valid(validate: Callable[..., object], number: str, *, check_digit: bool) -> bool:
    try:
        validate(number, validate_check_digits=check_digit)
    except ValidationError:
        return False
    return True


def _real_date(year: str, month: str, day: str) -> bool:
    """Whether YYMMDD is a date of the 1900s or the 2000s."""
    for century in (1900, 2000):
        try:
            datetime.date(century + int(year), int(month), int(day))
        except ValueError:
            continue
        return True
    return False


def find_ids(text: str, *, shadowed: str | None = None) -> list[Detection]:
    """CURP, RFC, INE voter keys and NSS in ``text``; python-stdnum checks the candidates.

    - CURP: the full structure (name letters with a vowel second, a real birth date, sex
      H/M, one of the 33 state codes, three consonants, the homoclave character and a
      digit). The check digit is *not* required: a CURP copied with one wrong last digit
      is still the patient's CURP, and the structure alone is specific enough.
    - RFC (13 characters for persons, 12 for companies): letters, a real date and the
      homoclave; the check digit is required unless "RFC" stands just before it, because
      three letters, a date and three characters also describe invoice and lot numbers
      (``FAC240115001``). After "RFC", the 10-character form without homoclave counts too.
    - INE voter key (clave de elector): 18 characters, six letters, a real birth date, a
      state of birth (01-32, or 87/88 for abroad), H/M and three digits. It has no check
      digit; that structure is as specific as a CURP's.
    - NSS: 11 digits (contiguous, or grouped 2-2-2-4-1 or 10-1); the check digit (Luhn) is
      required unless "NSS"/"IMSS"/"seguro social" stands just before it, because numbers
      of 11 digits are common.
    """
    shade = shadow(text) if shadowed is None else shadowed
    if not _ID_HINT.search(shade):
        return []
    lowered = _lower(text)
    shade = _upper(shade)  # the ID patterns are upper case: cheaper than IGNORECASE
    found: list[Detection] = []
    for match in _windowed(_CURP, shade, _ID_HINT, before=12, after=24):
        value = "".join(match.groups())
        if _valid(curp.validate, value, check_digit=False):
            found.append(Detection(match.start(), match.end(), "ID", value, cued=True))
    for match in _windowed(_RFC, shade, _ID_HINT, before=12, after=24):
        value = "".join(group or "" for group in match.groups())
        cued = _cued(lowered, match.start(), _RFC_CUE)
        if len(value) == 10 and not cued:
            continue
        if _valid(rfc.validate, value, check_digit=not cued):
            found.append(Detection(match.start(), match.end(), "ID", value, cued))
    for match in _windowed(_INE, shade, _ID_HINT, before=12, after=24):
        _, year, month, day, state, _ = match.groups()
        if _real_date(year, month, day) and (1 <= int(state) <= 32 or state in ("87", "88")):
            found.append(Detection(match.start(), match.end(), "ID", "".join(match.groups()), cued=True))
    for match in _windowed(_NSS, shade, _ID_HINT, before=12, after=24):
        raw = match.group(1)
        groups = _digit_groups(raw)
        if len(groups) > 1 and groups not in ([2, 2, 2, 4, 1], [10, 1]):
            continue
        digits = "".join(char for char in raw if char.isdigit())
        cued = _cued(lowered, match.start(), _NSS_CUE)
        if cued or luhn.is_valid(digits):
            found.append(Detection(match.start(), match.end(), "ID", digits, cued))
    return found


# --- all together --------------------------------------------------------------------------


def find(text: str, region: str) -> list[Detection]:
    """Every identifier the recognisers find in ``text``, overlapping ones included."""
    shade = shadow(text)
    return [
        *find_emails(text, shadowed=shade),
        *find_ids(text, shadowed=shade),
        *find_phones(text, region, shadowed=shade),
    ]


Span = tuple[int, int, str]


def resolve(caller: Sequence[Span], detections: Iterable[Detection]) -> list[Span]:
    """The caller's spans plus the detections that overlap nothing chosen before them.

    Order of choice: the caller's spans (already checked not to overlap), then the longest
    detection, then the earliest, then the one with a cue word before it, then by
    :data:`CATEGORY_ORDER`. The result is sorted by position.
    """
    # Chosen spans never overlap, so they stay sorted by start and each candidate is
    # checked against its two neighbours only: linear-logarithmic, where checking every
    # chosen span made a message of many addresses quadratic (8,000 took a second).
    chosen: list[Span] = sorted(caller)
    starts = [start for start, _, _ in chosen]
    ranked = sorted(
        set(detections),
        key=lambda found: (
            found.start - found.end,
            found.start,
            not found.cued,
            _CATEGORY_RANK[found.category],
            found.value,
        ),
    )
    for found in ranked:
        at = bisect.bisect_right(starts, found.start)
        if at and chosen[at - 1][1] > found.start:
            continue  # overlaps the chosen span starting at or before it
        if at < len(chosen) and chosen[at][0] < found.end:
            continue  # overlaps the chosen span starting after it
        chosen.insert(at, (found.start, found.end, found.category))
        starts.insert(at, found.start)
    return chosen


def _whole(text: str, detections: list[Detection], category: str) -> str | None:
    stripped = text.strip()
    offset = len(text) - len(text.lstrip())
    for found in detections:
        if found.category == category and found.start == offset and found.end == offset + len(stripped):
            return found.value
    return None


# Memoised: encode_text normalises every span it found, and a conversation repeats them.
# Only short texts are kept, so a caller's long value cannot fill the memory.
_MEMO_MAX_CHARS = 120


@lru_cache(maxsize=4096)
def _canonical_phone(text: str, region: str) -> str | None:
    return _whole(text, find_phones(text, region), "TELEFONO")


@lru_cache(maxsize=4096)
def _canonical_email(text: str) -> str | None:
    return _whole(text, find_emails(text), "EMAIL")


def canonical_phone(text: str, region: str) -> str | None:
    """E.164 of ``text`` when the whole of it is one phone number the recogniser finds."""
    if len(text) > _MEMO_MAX_CHARS:
        return _canonical_phone.__wrapped__(text, region)
    return _canonical_phone(text, region)


def canonical_email(text: str) -> str | None:
    """The normalised address when the whole of ``text`` is one address, written or spelled out."""
    if len(text) > _MEMO_MAX_CHARS:
        return _canonical_email.__wrapped__(text)
    return _canonical_email(text)

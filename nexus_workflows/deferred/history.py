"""What a row remembers of its past: ``last_error`` and the bounded ``history`` list."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from nexus_workflows.limits import HISTORY_MAX_ENTRIES, LAST_ERROR_MAX_LENGTH

HISTORY_ERROR_MAX_LENGTH = 300


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def storable_text(text: str) -> str:
    """Text any database accepts: no NUL, no lone surrogate (PostgreSQL rejects the first,
    every UTF-8 encoder the second)."""
    if "\x00" in text:
        text = text.replace("\x00", "\N{REPLACEMENT CHARACTER}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _message_of(error: BaseException) -> str:
    try:
        # str() raises TypeError when __str__ returns a non-string. Bounded before
        # sanitising, so a huge message costs no more than a short one; str.__str__ turns
        # a str subclass (which could override slicing) into a plain str.
        return str.__str__(str(error))[: LAST_ERROR_MAX_LENGTH + 1]
    except Exception:  # noqa: BLE001 - a broken __str__ must not break bookkeeping
        return "<the error's message could not be rendered>"


def describe_error(error: BaseException) -> str:
    """``"<ExceptionType>: <message>"``: bounded, storable text (no NUL, no lone
    surrogates), even when ``str(error)`` raises or returns something odd."""
    try:
        name = str.__str__(type(error).__name__)
    except Exception:  # noqa: BLE001
        name = "Exception"
    message = _message_of(error)
    text = f"{name}: {message}" if message else name
    return truncate(storable_text(text), LAST_ERROR_MAX_LENGTH)


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0] if text else ""


def append_entry(history: list[Any] | None, **fields: Any) -> list[Any]:
    """A new history list with one entry added (newest last), keeping the newest
    ``HISTORY_MAX_ENTRIES``."""
    entry = {"at": timezone.now().isoformat(), **fields}
    if isinstance(entry.get("error"), str):
        entry["error"] = truncate(storable_text(entry["error"]), HISTORY_ERROR_MAX_LENGTH)
    return [*(history or []), entry][-HISTORY_MAX_ENTRIES:]

"""What a row remembers of its past: ``last_error`` and the bounded ``history`` list."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from .limits import HISTORY_MAX_ENTRIES, LAST_ERROR_MAX_LENGTH

HISTORY_ERROR_MAX_LENGTH = 300


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_error(error: BaseException) -> str:
    """``"<ExceptionType>: <message>"``, bounded, even when ``str(error)`` itself raises."""
    name = type(error).__name__
    try:
        message = str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ must not break bookkeeping
        message = "<the error's message could not be rendered>"
    text = f"{name}: {message}" if message else name
    return truncate(text, LAST_ERROR_MAX_LENGTH)


def first_line(text: str) -> str:
    return text.strip().split("\n", 1)[0] if text else ""


def append_entry(history: list[Any] | None, **fields: Any) -> list[Any]:
    """A new history list with one entry added (newest last), keeping the newest
    ``HISTORY_MAX_ENTRIES``."""
    entry = {"at": timezone.now().isoformat(), **fields}
    if isinstance(entry.get("error"), str):
        entry["error"] = truncate(entry["error"], HISTORY_ERROR_MAX_LENGTH)
    return [*(history or []), entry][-HISTORY_MAX_ENTRIES:]

"""Eval mode: rehearse a workflow against the real Airtable without writing to it.

While it is on, the write helpers (create, update, linked create) send nothing, log what
they would have written (table and field names, never values) and return ``None``
(create) or ``[]`` (update). Reads go through, including the look-ups a write depends
on. The switch is process-wide.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

logger = logging.getLogger(__name__)

_enabled = False


def set_eval_mode(enabled: bool) -> None:
    """Turn eval mode on or off for this process."""
    global _enabled
    if not isinstance(enabled, bool):
        raise TypeError(f"set_eval_mode() takes True or False; got {type(enabled).__name__}")
    if enabled != _enabled:
        logger.info("Airtable eval mode %s", "on: writes are not sent" if enabled else "off")
    _enabled = enabled


def is_eval_mode() -> bool:
    return _enabled


def log_skipped_write(label: str, field_names: Iterable[str], *, records: int = 1) -> None:
    names = sorted(field_names)
    logger.info(
        "eval mode: %s not sent (%d record(s); fields: %s)",
        label,
        records,
        ", ".join(names) or "none",
        extra={"airtable_label": label, "airtable_fields": names, "airtable_records": records},
    )

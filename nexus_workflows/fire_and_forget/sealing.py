"""A job's patient data crosses Redis sealed: its trigger, and a failed ``prepare``'s message.

Both may hold patient data, and unsealed they would be shown wherever RQ shows a job: in
Redis itself, on django-rq's job pages (which any staff user may open) and in RQ's failure
log records (which carry a job's arguments as extra fields, printed by JSON formatters). So
both are encrypted with the PHI encryption keys (``PHI_ENCRYPTION_KEYS``, newest first) and
bound to the job's id, which names the workflow: a sealed value copied onto another job
does not open. Only the job itself opens its trigger, and only the admin's reveal page
(:mod:`nexus_workflows.admin.jobs`, behind a permission, audited) shows either to a person.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from nexus_workflows.exceptions import SealedDataUnreadable

if TYPE_CHECKING:
    from nexus_workflows.phi.keys import Keyring

# What a sealed value is of, sealed in with it: a trigger never opens as an error message.
_TRIGGER = "nexus_workflows fire-and-forget trigger"
_ERROR = "nexus_workflows fire-and-forget error"


def _keyring() -> Keyring:
    # Imported on use: the package is imported from settings, before Django's apps exist.
    from nexus_workflows.phi.keys import keyring

    return keyring()


def seal_trigger(job_id: str, trigger_text: str) -> str:
    """The trigger's JSON text, sealed for job ``job_id``."""
    return _keyring().seal(f"{_TRIGGER}|{job_id}", trigger_text)


def open_trigger(job_id: str, sealed: str) -> Any:
    """The trigger sealed for ``job_id``, as ``prepare`` receives it."""
    return json.loads(_open(f"{_TRIGGER}|{job_id}", sealed, job_id, "trigger"))


def seal_error(job_id: str, message: str) -> str:
    """A failed ``prepare``'s message (type and text), sealed for job ``job_id``."""
    return _keyring().seal(f"{_ERROR}|{job_id}", message)


def open_error(job_id: str, sealed: str) -> str:
    return _open(f"{_ERROR}|{job_id}", sealed, job_id, "error message")


def _open(context: str, sealed: Any, job_id: str, what: str) -> str:
    text = _keyring().unseal(context, sealed) if isinstance(sealed, str) else None
    if text is None:
        # Not the job id in the message: it holds the dedupe key (an attribute instead).
        raise SealedDataUnreadable(
            f"a fire-and-forget job: its sealed {what} cannot be opened with any configured "
            "PHI encryption key. Keep a removed key in PHI_ENCRYPTION_KEYS until every job "
            "sealed with it has run and passed the RETENTION horizon.",
            job_id=job_id,
        )
    return text

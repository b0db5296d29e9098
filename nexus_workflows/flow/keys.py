"""Serial and rate keys: computed from the trigger at enqueue, stored as keyed hashes."""

from __future__ import annotations

from typing import Any

from nexus_workflows.exceptions import InvalidFlowKey
from nexus_workflows.flow.options import FlowLimits
from nexus_workflows.json_values import text_problem
from nexus_workflows.redaction import raised_at

SERIAL = "serial"
RATE = "rate"


def _hash(kind: str, purpose: str, function: Any, trigger: Any) -> str | None:
    # Messages name the kind and the rule, never the key or the trigger (patient data).
    try:
        key = function(trigger)
    except Exception as error:  # noqa: BLE001 - whatever the user's function raises
        # Not chained: the error's message may quote the trigger (patient data).
        raise InvalidFlowKey(
            f"workflow {kind!r}: {purpose}_key raised {type(error).__name__} ({raised_at(error)}) "
            "for this trigger"
        ) from None
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidFlowKey(
            f"workflow {kind!r}: {purpose}_key returned {type(key).__name__}; it must return a "
            "string or None (convert numbers with str())"
        )
    problem = text_problem(key)
    if problem:  # it is hashed as UTF-8
        raise InvalidFlowKey(
            f"workflow {kind!r}: {purpose}_key returned a string that {problem}; it must return "
            "valid Unicode text without NUL characters"
        )
    from nexus_workflows.phi.keys import keyring

    return keyring().flow_key_hash(kind, purpose, key)


def flow_key_hashes(kind: str, flow: FlowLimits | None, trigger: Any) -> tuple[str | None, str | None]:
    """``(serial key hash, rate key hash)`` of a trigger; raises :class:`InvalidFlowKey`
    before anything is written."""
    if flow is None:
        return None, None
    serial = _hash(kind, SERIAL, flow.serial_key, trigger) if flow.serial_key else None
    rate = _hash(kind, RATE, flow.rate_key, trigger) if flow.rate_key else None
    return serial, rate

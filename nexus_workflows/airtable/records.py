"""The five Airtable helpers. Every request goes through :func:`with_airtable_retry`.

They never turn a failure into an empty answer: ``None`` from
:func:`get_record_by_filter` means "no record matches", ``[]`` from
:func:`update_record_by_filter` means "no record matched", and a failed call raises (see
:mod:`.exceptions`). Arguments are checked before anything is sent.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.views.decorators.debug import sensitive_variables
from pyairtable.api.types import RecordDict

from nexus_workflows.airtable.client import get_table
from nexus_workflows.airtable.eval_mode import is_eval_mode, log_skipped_write
from nexus_workflows.airtable.exceptions import InvalidAirtableArgument, InvalidLink, ReferenceNotFound
from nexus_workflows.airtable.formulas import FormulaInput, to_formula
from nexus_workflows.airtable.retry import with_airtable_retry
from nexus_workflows.json_values import INT_MAX, INT_MIN, MAX_DEPTH, text_problem

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkSpec:
    """Which record ``add_linked_record`` links to, and where.

    ``table``: the table of the referenced record (same base); ``formula``: how to find
    it (a ``{field: value}`` dict or a pyairtable formula; the first match is used);
    ``field``: the link field of the new record that receives the reference.
    """

    table: str
    formula: FormulaInput
    field: str


# sensitive_variables: an error report (Django's, DEBUG off) of a failed call shows no
# frame's variables, here or below (fields, formulas, records, request bodies): patient data.
@sensitive_variables()
def add_record(
    base_id: str, table: str, fields: Mapping[str, Any], *, typecast: bool = False
) -> RecordDict | None:
    """Create one record and return it (``None`` in eval mode).

    Not retried after a network failure that may have reached Airtable: a lost answer
    can hide a created record. The caller decides what to do (see the demo's
    ``triage_projection`` for a look-up before creating again).
    """
    label = f"add_record {table}"
    _check_target(label, base_id, table)
    payload = _check_fields(label, fields)
    _check_bool(label, "typecast", typecast)
    if is_eval_mode():
        log_skipped_write(label, payload)
        return None
    return _create(label, base_id, table, payload, typecast)


@sensitive_variables()
def get_records(
    base_id: str,
    table: str,
    *,
    formula: FormulaInput | None = None,
    fields: Sequence[str] | None = None,
    view: str | None = None,
    max_records: int | None = None,
    sort: Sequence[str] | None = None,
) -> list[RecordDict]:
    """Every record that matches (all pages), or every record without a formula.

    ``fields`` limits the fields returned; ``sort`` is a list of field names, ``"-Name"``
    for descending; ``view`` and ``max_records`` as in Airtable's API.
    """
    label = f"get_records {table}"
    _check_target(label, base_id, table)
    options: dict[str, Any] = {}
    if formula is not None:
        options["formula"] = to_formula(formula, what=f"{label}: formula")
    if fields is not None:
        options["fields"] = _check_names(label, "fields", fields)
    if sort is not None:
        options["sort"] = _check_names(label, "sort", sort)
    if view is not None:
        if not isinstance(view, str) or not view:
            raise InvalidAirtableArgument(f"{label}: view must be a non-empty string")
        options["view"] = view
    if max_records is not None:
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records < 1:
            raise InvalidAirtableArgument(f"{label}: max_records must be a whole number of at least 1")
        options["max_records"] = max_records
    return with_airtable_retry(lambda: get_table(base_id, table).all(**options), label)


@sensitive_variables()
def get_record_by_filter(base_id: str, table: str, formula: FormulaInput) -> RecordDict | None:
    """The first record that matches ``formula``, or ``None`` when none does."""
    label = f"get_record_by_filter {table}"
    _check_target(label, base_id, table)
    return _first(label, base_id, table, to_formula(formula, what=f"{label}: formula"))


@sensitive_variables()
def update_record_by_filter(
    base_id: str,
    table: str,
    formula: FormulaInput,
    fields: Mapping[str, Any],
    *,
    typecast: bool = False,
) -> list[RecordDict]:
    """Set ``fields`` on every record that matches ``formula``; return the updated
    records, ``[]`` when none matched (and in eval mode, after the look-up).

    Updates are sent 10 records per request (Airtable's limit); they are idempotent, so
    they are retried after network failures too. Should a later batch fail for good,
    the earlier ones stay written: run the same call again to finish.
    """
    label = f"update_record_by_filter {table}"
    _check_target(label, base_id, table)
    condition = to_formula(formula, what=f"{label}: formula")
    payload = _check_fields(label, fields)
    _check_bool(label, "typecast", typecast)
    matches = with_airtable_retry(
        lambda: get_table(base_id, table).all(formula=condition), f"{label} (look-up)"
    )
    if not matches:
        return []
    if is_eval_mode():
        log_skipped_write(label, payload, records=len(matches))
        return []
    updates = [{"id": record["id"], "fields": dict(payload)} for record in matches]
    return with_airtable_retry(
        lambda: get_table(base_id, table).batch_update(updates, typecast=typecast),  # type: ignore[arg-type]
        label,
    )


@sensitive_variables()
def add_linked_record(
    base_id: str, target_table: str, fields: Mapping[str, Any], link: LinkSpec | Mapping[str, Any]
) -> RecordDict | None:
    """Find the record ``link`` names, then create a record in ``target_table`` with
    ``fields`` and the link field set to that record's id; return the new record
    (``None`` in eval mode, after the look-up).

    :class:`ReferenceNotFound` (not permanent) when nothing matches: nothing is created.
    The create is not retried after a network failure that may have reached Airtable.
    """
    label = f"add_linked_record {target_table}"
    _check_target(label, base_id, target_table)
    spec = _check_link(label, link)
    condition = to_formula(spec.formula, what=f"{label}: link formula")
    payload = _check_fields(label, fields)
    if spec.field in payload:
        raise InvalidAirtableArgument(
            f"{label}: fields already set link field {spec.field!r}; leave it to the link"
        )
    reference = _first(f"{label} (look-up in {spec.table})", base_id, spec.table, condition)
    if reference is None:
        raise ReferenceNotFound(label=label, table=spec.table, field=spec.field)
    linked = {**payload, spec.field: [reference["id"]]}
    if is_eval_mode():
        log_skipped_write(label, linked)
        return None
    return _create(label, base_id, target_table, linked, False)


def _create(label: str, base_id: str, table: str, fields: dict[str, Any], typecast: bool) -> RecordDict:
    return with_airtable_retry(
        lambda: get_table(base_id, table).create(fields, typecast=typecast),
        label,
        retry_network_errors=False,
    )


def _first(label: str, base_id: str, table: str, formula: Any) -> RecordDict | None:
    return with_airtable_retry(lambda: get_table(base_id, table).first(formula=formula), label)


# --- argument checks: messages name fields and types, never values -------------------


def _check_target(label: str, base_id: object, table: object) -> None:
    for name, value in (("base_id", base_id), ("table", table)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidAirtableArgument(
                f"{label}: {name} must be a non-empty string; got {type(value).__name__}"
            )


def _check_fields(label: str, fields: object) -> dict[str, Any]:
    if not isinstance(fields, Mapping):
        raise InvalidAirtableArgument(
            f"{label}: fields must be a dict of field names to values; got {type(fields).__name__}"
        )
    for name, value in fields.items():
        if not isinstance(name, str) or not name.strip():
            raise InvalidAirtableArgument(
                f"{label}: field names must be non-empty strings; got {type(name).__name__}"
            )
        problem = _unsendable(value)
        if problem:
            raise InvalidAirtableArgument(
                f"{label}: the value of field {name!r} cannot be sent as JSON ({problem}); use "
                "str, finite numbers, bools, None, lists and dicts with string keys"
            )
    return dict(fields)


def _unsendable(value: object, depth: int = 0) -> str | None:
    """Why ``value`` cannot go into Airtable's JSON as it is, or None. ``json.dumps`` alone
    would let NaN through (which requests then refuses, a transient-looking error) and
    turn number keys into strings; never names the value itself."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH}"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):  # as a trigger's: JSON could not write out a far larger one
        return None if INT_MIN <= value <= INT_MAX else "an integer outside -2**63 … 2**63-1"
    if isinstance(value, float):
        return None if math.isfinite(value) else "a float that is not finite"
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, list | tuple):
        return next((p for item in value if (p := _unsendable(item, depth + 1))), None)
    if isinstance(value, Mapping):
        if not all(isinstance(key, str) for key in value):
            return "a dict key that is not a string"
        return next((p for item in value.values() if (p := _unsendable(item, depth + 1))), None)
    return f"a value of type {type(value).__name__}"


def _check_names(label: str, option: str, names: object) -> list[str]:
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise InvalidAirtableArgument(
            f"{label}: {option} must be a list of field names; got {type(names).__name__}"
        )
    if not all(isinstance(name, str) and name.strip() for name in names):
        raise InvalidAirtableArgument(f"{label}: {option} must contain only non-empty field names")
    return list(names)


def _check_bool(label: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidAirtableArgument(f"{label}: {name} must be True or False; got {type(value).__name__}")


def _check_link(label: str, link: object) -> LinkSpec:
    if isinstance(link, Mapping):
        unknown = set(link) - {"table", "formula", "field"}
        missing = {"table", "formula", "field"} - set(link)
        if unknown or missing:
            raise InvalidLink(
                f"{label}: link must have exactly the keys table, formula and field"
                + (f"; missing {', '.join(sorted(missing))}" if missing else "")
                + (f"; unknown {', '.join(sorted(map(str, unknown)))}" if unknown else "")
            )
        link = LinkSpec(table=link["table"], formula=link["formula"], field=link["field"])
    if not isinstance(link, LinkSpec):
        raise InvalidLink(
            f"{label}: link must be a LinkSpec(table=..., formula=..., field=...) or a dict with "
            f"those keys; got {type(link).__name__}"
        )
    for name in ("table", "field"):
        value = getattr(link, name)
        if not isinstance(value, str) or not value.strip():
            raise InvalidLink(f"{label}: link {name} must be a non-empty string; got {type(value).__name__}")
    return link

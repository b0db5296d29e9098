"""Airtable helpers over pyairtable, with transient errors retried and permanent ones tagged.

Public API::

    from nexus_workflows.airtable import (
        add_record, get_records, get_record_by_filter, update_record_by_filter,
        add_linked_record, LinkSpec, ReferenceNotFound,
        with_airtable_retry, is_permanent_airtable_error, set_eval_mode, get_table,
    )
"""

from nexus_workflows.airtable.client import get_table
from nexus_workflows.airtable.eval_mode import is_eval_mode, set_eval_mode
from nexus_workflows.airtable.exceptions import (
    AirtableAnswerError,
    AirtableError,
    AirtableHTTPError,
    AirtableNetworkError,
    AirtableNotConfigured,
    InvalidAirtableArgument,
    InvalidFormula,
    InvalidLink,
    ReferenceNotFound,
)
from nexus_workflows.airtable.formulas import FormulaInput, equality_match, to_formula
from nexus_workflows.airtable.records import (
    LinkSpec,
    add_linked_record,
    add_record,
    get_record_by_filter,
    get_records,
    update_record_by_filter,
)
from nexus_workflows.airtable.retry import is_permanent_airtable_error, with_airtable_retry

__all__ = [
    "AirtableAnswerError",
    "AirtableError",
    "AirtableHTTPError",
    "AirtableNetworkError",
    "AirtableNotConfigured",
    "FormulaInput",
    "InvalidAirtableArgument",
    "InvalidFormula",
    "InvalidLink",
    "LinkSpec",
    "ReferenceNotFound",
    "add_linked_record",
    "add_record",
    "equality_match",
    "get_record_by_filter",
    "get_records",
    "get_table",
    "is_eval_mode",
    "is_permanent_airtable_error",
    "set_eval_mode",
    "to_formula",
    "update_record_by_filter",
    "with_airtable_retry",
]

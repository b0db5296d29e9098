"""A failed Airtable call in a request: Django's error report (``DEBUG`` off, the e-mail's
HTML part or a tracker built on Django's reporter: every frame's local variables) holds
none of the fields, formulas or records the helper was given or was sending."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
from django.views.debug import ExceptionReporter

from nexus_workflows.airtable import (
    AirtableError,
    LinkSpec,
    add_linked_record,
    add_record,
    get_record_by_filter,
    get_records,
    update_record_by_filter,
)
from tests.airtable.conftest import BASE
from tests.airtable.emulator import AirtableEmulator

NAME = "Zorbatilde Quixhuatl"
MARK = "zorbatilde"


def report_of(call: Callable[[], Any]) -> str:
    try:
        call()
    except AirtableError:
        reporter = ExceptionReporter(None, *sys.exc_info(), is_email=True)
        return reporter.get_traceback_text() + reporter.get_traceback_html()
    raise AssertionError("the call did not fail")


CALLS: dict[str, Callable[[], Any]] = {
    "add_record": lambda: add_record(BASE, "Patients", {"Name": NAME}),
    "get_records": lambda: get_records(BASE, "Patients", formula={"Name": NAME}),
    "get_record_by_filter": lambda: get_record_by_filter(BASE, "Patients", {"Name": NAME}),
    "update_record_by_filter": lambda: update_record_by_filter(
        BASE, "Patients", {"Name": "x"}, {"Name": NAME}
    ),
    "add_linked_record": lambda: add_linked_record(
        BASE, "Visits", {"Note": NAME}, LinkSpec(table="Patients", formula={"Name": NAME}, field="Patient")
    ),
}


@pytest.mark.parametrize("helper", sorted(CALLS))
def test_a_failed_call_reports_no_patient_data(
    airtable: AirtableEmulator, settings: Any, helper: str
) -> None:
    settings.DEBUG = False
    airtable.fail(422, times=10, message="cannot parse")
    report = report_of(CALLS[helper])
    assert "AirtableHTTPError" in report
    assert MARK not in report.lower()

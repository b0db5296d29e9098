"""Eval mode: writes are not sent (and logged without values); reads go through."""

from __future__ import annotations

import logging

import pytest

from nexus_workflows.airtable import (
    LinkSpec,
    ReferenceNotFound,
    add_linked_record,
    add_record,
    get_record_by_filter,
    get_records,
    is_eval_mode,
    set_eval_mode,
    update_record_by_filter,
)
from tests.airtable.conftest import BASE
from tests.airtable.emulator import AirtableEmulator

PATIENT = "Maria Lopez"


def test_eval_mode_sends_no_write(airtable: AirtableEmulator, caplog: pytest.LogCaptureFixture) -> None:
    patient = airtable.add(BASE, "Patients", {"Patient ID": "P-17", "Name": PATIENT, "Status": "new"})
    set_eval_mode(True)

    with caplog.at_level(logging.INFO, logger="nexus_workflows"):
        created = add_record(BASE, "Patients", {"Name": PATIENT})
        updated = update_record_by_filter(BASE, "Patients", {"Patient ID": "P-17"}, {"Status": PATIENT})
        linked = add_linked_record(
            BASE,
            "Triage",
            {"Summary": PATIENT},
            LinkSpec(table="Patients", formula={"Patient ID": "P-17"}, field="Patient"),
        )

    assert created is None
    assert updated == []
    assert linked is None
    assert airtable.writes() == []
    assert airtable.records(BASE, "Patients") == [patient]
    assert airtable.records(BASE, "Triage") == []
    # The look-ups the writes depend on are reads: they went through.
    assert len(airtable.requests_for("GET")) == 2
    skipped = [r for r in caplog.records if r.getMessage().startswith("eval mode:")]
    assert [r.getMessage() for r in skipped] == [
        "eval mode: add_record Patients not sent (1 record(s); fields: Name)",
        "eval mode: update_record_by_filter Patients not sent (1 record(s); fields: Status)",
        "eval mode: add_linked_record Triage not sent (1 record(s); fields: Patient, Summary)",
    ]
    assert PATIENT not in caplog.text


def test_reads_go_through_in_eval_mode(airtable: AirtableEmulator) -> None:
    airtable.add(BASE, "Patients", {"Name": "a"})
    set_eval_mode(True)

    assert [r["fields"] for r in get_records(BASE, "Patients")] == [{"Name": "a"}]
    assert get_record_by_filter(BASE, "Patients", {"Name": "a"}) is not None


def test_a_missing_reference_is_still_reported_in_eval_mode(airtable: AirtableEmulator) -> None:
    set_eval_mode(True)
    with pytest.raises(ReferenceNotFound):
        add_linked_record(BASE, "Triage", {}, LinkSpec(table="Patients", formula={"ID": "x"}, field="P"))


def test_writes_are_sent_again_once_eval_mode_is_off(airtable: AirtableEmulator) -> None:
    set_eval_mode(True)
    assert is_eval_mode()
    set_eval_mode(False)

    assert add_record(BASE, "Patients", {"Name": "a"}) is not None
    assert len(airtable.writes()) == 1


def test_set_eval_mode_takes_a_bool() -> None:
    with pytest.raises(TypeError, match="True or False"):
        set_eval_mode("yes")  # type: ignore[arg-type]

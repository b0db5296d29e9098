"""The five helpers against the emulator: results, request shapes, failures raised."""

from __future__ import annotations

from typing import Any

import pytest
from pyairtable.formulas import GT, Field

from nexus_workflows.airtable import (
    AirtableError,
    AirtableNotConfigured,
    InvalidAirtableArgument,
    InvalidLink,
    LinkSpec,
    ReferenceNotFound,
    add_linked_record,
    add_record,
    get_record_by_filter,
    get_records,
    is_permanent_airtable_error,
    update_record_by_filter,
)
from nexus_workflows.exceptions import is_permanent
from tests.airtable.conftest import BASE
from tests.airtable.emulator import AirtableEmulator

PATIENT_LINK = LinkSpec(table="Patients", formula={"Patient ID": "P-17"}, field="Patient")


def test_add_record_creates_and_returns_the_record(airtable: AirtableEmulator) -> None:
    record = add_record(BASE, "Patients", {"Name": "a", "Age": 40}, typecast=True)

    assert record is not None
    assert record["id"].startswith("rec")
    assert record["fields"] == {"Name": "a", "Age": 40}
    assert airtable.records(BASE, "Patients") == [record]
    (request,) = airtable.requests_for("POST")
    assert request.body["typecast"] is True


def test_table_names_are_quoted_in_the_url(airtable: AirtableEmulator) -> None:
    record = add_record(BASE, "Triage / Intake", {"Name": "a"})
    assert airtable.records(BASE, "Triage / Intake") == [record]


def test_get_records_filters_and_passes_its_options(airtable: AirtableEmulator) -> None:
    for name, age in [("c", 30), ("a", 30), ("b", 30), ("d", 50)]:
        airtable.add(BASE, "Patients", {"Name": name, "Age": age, "Notes": "x"})

    records = get_records(
        BASE, "Patients", formula={"Age": 30}, fields=["Name"], sort=["-Name"], max_records=2, view="Grid"
    )

    assert [r["fields"] for r in records] == [{"Name": "c"}, {"Name": "b"}]
    (request,) = airtable.requests_for("GET")
    assert request.query["fields[]"] == ["Name"]
    assert request.query["sort[0][field]"] == ["Name"]
    assert request.query["sort[0][direction]"] == ["desc"]
    assert request.query["maxRecords"] == ["2"]
    assert request.query["view"] == ["Grid"]


def test_get_records_reads_every_page(airtable: AirtableEmulator) -> None:
    airtable.page_size = 2
    for number in range(5):
        airtable.add(BASE, "Patients", {"Name": f"p{number}"})

    records = get_records(BASE, "Patients")

    assert sorted(r["fields"]["Name"] for r in records) == ["p0", "p1", "p2", "p3", "p4"]
    assert len(airtable.requests_for("GET")) == 3


def test_get_records_takes_pyairtable_formula_objects(airtable: AirtableEmulator) -> None:
    airtable.add(BASE, "Patients", {"Name": "a"})
    # The emulator only speaks equality, so it answers 422 like Airtable does for a
    # formula it cannot parse; what matters here is the text that was sent.
    with pytest.raises(AirtableError):
        get_records(BASE, "Patients", formula=GT(Field("Age"), 21))
    assert airtable.requests_for("GET")[0].formula == "{Age}>21"


def test_get_record_by_filter_returns_the_first_match_or_none(airtable: AirtableEmulator) -> None:
    first = airtable.add(BASE, "Patients", {"Name": "a", "Ward": "3"})
    airtable.add(BASE, "Patients", {"Name": "b", "Ward": "3"})

    found = get_record_by_filter(BASE, "Patients", {"Ward": "3"})

    assert found is not None
    assert found["id"] == first["id"]
    assert get_record_by_filter(BASE, "Patients", {"Ward": "9"}) is None
    assert [r.query["maxRecords"] for r in airtable.requests_for("GET")] == [["1"], ["1"]]


def test_update_record_by_filter_updates_every_match(airtable: AirtableEmulator) -> None:
    for number in range(12):
        airtable.add(BASE, "Patients", {"Name": f"p{number}", "Ward": "3", "Status": "new"})
    other = airtable.add(BASE, "Patients", {"Name": "q", "Ward": "4", "Status": "new"})

    updated = update_record_by_filter(BASE, "Patients", {"Ward": "3"}, {"Status": "seen"}, typecast=True)

    assert len(updated) == 12
    assert {r["fields"]["Status"] for r in updated} == {"seen"}
    statuses = {r["id"]: r["fields"]["Status"] for r in airtable.records(BASE, "Patients")}
    assert statuses[other["id"]] == "new"
    assert sorted(statuses.values()) == ["new"] + ["seen"] * 12
    patches = airtable.requests_for("PATCH")
    assert [len(p.body["records"]) for p in patches] == [10, 2]  # Airtable's 10-record limit
    assert all(p.body["typecast"] is True for p in patches)


def test_update_record_by_filter_with_no_match_returns_an_empty_list(airtable: AirtableEmulator) -> None:
    airtable.add(BASE, "Patients", {"Ward": "3"})

    assert update_record_by_filter(BASE, "Patients", {"Ward": "9"}, {"Status": "seen"}) == []
    assert airtable.requests_for("PATCH") == []


def test_add_linked_record_links_the_referenced_record(airtable: AirtableEmulator) -> None:
    patient = airtable.add(BASE, "Patients", {"Patient ID": "P-17"})

    record = add_linked_record(BASE, "Triage", {"Submission": "S-1"}, PATIENT_LINK)

    assert record is not None
    assert record["fields"] == {"Submission": "S-1", "Patient": [patient["id"]]}
    assert airtable.records(BASE, "Triage") == [record]


def test_add_linked_record_accepts_the_link_as_a_dict(airtable: AirtableEmulator) -> None:
    patient = airtable.add(BASE, "Patients", {"Patient ID": "P-17"})

    record = add_linked_record(
        BASE, "Triage", {}, {"table": "Patients", "formula": {"Patient ID": "P-17"}, "field": "Patient"}
    )

    assert record is not None
    assert record["fields"] == {"Patient": [patient["id"]]}


def test_a_missing_reference_raises_reference_not_found_which_is_not_permanent(
    airtable: AirtableEmulator,
) -> None:
    with pytest.raises(ReferenceNotFound) as caught:
        add_linked_record(BASE, "Triage", {"Submission": "S-1"}, PATIENT_LINK)

    error = caught.value
    assert error.permanent is False
    assert not is_permanent(error)
    assert not is_permanent_airtable_error(error)
    assert (error.table, error.field) == ("Patients", "Patient")
    assert "P-17" not in str(error)
    assert airtable.requests_for("POST") == []


@pytest.mark.parametrize(
    ("link", "message"),
    [
        ("Patients", "must be a LinkSpec"),
        ({"table": "Patients", "field": "Patient"}, "missing formula"),
        ({"table": "Patients", "formula": {"a": "b"}, "field": "P", "extra": 1}, "unknown extra"),
        (LinkSpec(table="", formula={"a": "b"}, field="Patient"), "link table must be a non-empty string"),
    ],
)
def test_a_bad_link_is_refused_before_anything_is_sent(
    airtable: AirtableEmulator, link: Any, message: str
) -> None:
    with pytest.raises(InvalidLink, match=message):
        add_linked_record(BASE, "Triage", {}, link)
    assert airtable.requests == []


def test_a_link_field_set_by_the_caller_is_refused(airtable: AirtableEmulator) -> None:
    with pytest.raises(InvalidAirtableArgument, match="link field 'Patient'"):
        add_linked_record(BASE, "Triage", {"Patient": ["recX"]}, PATIENT_LINK)
    assert airtable.requests == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: add_record(BASE, "Patients", ["Name"]), "fields must be a dict"),  # type: ignore[arg-type]
        (lambda: add_record(BASE, "Patients", {"Seen": object()}), "field 'Seen' cannot be sent as JSON"),
        (lambda: add_record(BASE, "Patients", {"Temp": float("nan")}), r"\(a float that is not finite\)"),
        (lambda: add_record(BASE, "Patients", {"Folio": 10**5000}), r"\(an integer outside -2\*\*63"),
        (lambda: add_record(BASE, "Patients", {"Notes": [{1: "x"}]}), r"\(a dict key that is not a string\)"),
        (lambda: add_record(BASE, "Patients", {"Name": "Ana \ud800"}), r"\(contains text that is not valid"),
        (lambda: add_record(BASE, "Patients", {1: "a"}), "field names must be non-empty"),  # type: ignore[dict-item]
        (lambda: add_record(BASE, "", {"Name": "a"}), "table must be a non-empty string"),
        (lambda: add_record(None, "Patients", {"Name": "a"}), "base_id must be"),  # type: ignore[arg-type]
        (lambda: add_record(BASE, "Patients", {}, typecast="yes"), "typecast must be True or False"),  # type: ignore[arg-type]
        (lambda: get_records(BASE, "Patients", fields="Name"), "fields must be a list"),  # type: ignore[arg-type]
        (lambda: get_records(BASE, "Patients", max_records=0), "max_records must be"),
        (lambda: get_records(BASE, "Patients", view=""), "view must be"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent(
    airtable: AirtableEmulator, call: Any, message: str
) -> None:
    with pytest.raises(InvalidAirtableArgument, match=message) as caught:
        call()
    assert caught.value.permanent is True
    assert airtable.requests == []


@pytest.mark.parametrize(
    "call",
    [
        lambda: get_records(BASE, "Patients"),
        lambda: get_record_by_filter(BASE, "Patients", {"Name": "a"}),
        lambda: update_record_by_filter(BASE, "Patients", {"Name": "a"}, {"Status": "seen"}),
        lambda: add_linked_record(BASE, "Triage", {}, PATIENT_LINK),
    ],
    ids=["get_records", "get_record_by_filter", "update_record_by_filter", "add_linked_record"],
)
def test_an_outage_is_raised_never_read_as_no_records(airtable: AirtableEmulator, call: Any) -> None:
    airtable.add(BASE, "Patients", {"Name": "a", "Patient ID": "P-17"})
    airtable.fail(503, method="GET", times=3)

    with pytest.raises(AirtableError) as caught:
        call()

    assert caught.value.status == 503
    assert len(airtable.requests_for("GET")) == 3


def test_an_update_failure_is_raised(airtable: AirtableEmulator) -> None:
    airtable.add(BASE, "Patients", {"Name": "a"})
    airtable.fail(422, method="PATCH")

    with pytest.raises(AirtableError) as caught:
        update_record_by_filter(BASE, "Patients", {"Name": "a"}, {"Status": 5})

    assert caught.value.permanent is True


def test_without_an_api_key_nothing_is_sent(
    airtable: AirtableEmulator, settings: Any, monkeypatch: Any
) -> None:
    settings.AIRTABLE_API_KEY = ""
    monkeypatch.delenv("AIRTABLE_API_KEY", raising=False)

    with pytest.raises(AirtableNotConfigured, match="AIRTABLE_API_KEY"):
        get_records(BASE, "Patients")
    assert airtable.requests == []


def test_the_api_key_can_come_from_the_environment(
    airtable: AirtableEmulator, settings: Any, monkeypatch: Any
) -> None:
    del settings.AIRTABLE_API_KEY
    monkeypatch.setenv("AIRTABLE_API_KEY", airtable.api_key)

    assert get_records(BASE, "Patients") == []

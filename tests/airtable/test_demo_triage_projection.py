"""The demo's ``demo-triage-projection`` under the real deferred runner, against the emulator."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings as django_settings

from nexus_workflows import enqueue
from nexus_workflows.deferred.runner import Runner, RunStats
from nexus_workflows.models import DeferredWork, Status
from tests.airtable.emulator import AirtableEmulator
from tests.clock import make_due

pytestmark = pytest.mark.django_db(transaction=True)

KIND = "demo-triage-projection"
TRIGGER = {"submission": "S-1001", "patient": "P-17", "priority": "urgent"}


@pytest.fixture
def base() -> str:
    return django_settings.DEMO_AIRTABLE_BASE_ID


@pytest.fixture
def patient(airtable: AirtableEmulator, base: str) -> dict[str, Any]:
    return airtable.add(base, "Patients", {"Patient ID": "P-17"})


def run_once() -> RunStats:
    return Runner(once=True, kinds=[KIND], install_signal_handlers=False).run()


def row(work_id: str | None) -> DeferredWork:
    assert work_id is not None
    return DeferredWork.objects.get(pk=int(work_id))


def creates(airtable: AirtableEmulator) -> list[Any]:
    return airtable.requests_for("POST", "Triage")


def test_the_projection_creates_one_linked_triage_record(
    airtable: AirtableEmulator, base: str, patient: dict[str, Any]
) -> None:
    work_id = enqueue(KIND, TRIGGER)

    assert run_once().done == 1

    (record,) = airtable.records(base, "Triage")
    assert record["fields"] == {"Submission": "S-1001", "Priority": "urgent", "Patient": [patient["id"]]}
    work = row(work_id)
    assert work.status == Status.DONE
    assert work.checkpoints == {"create_sent": True, "triage_record_id": record["id"]}


def test_a_503_on_the_create_reschedules_and_the_retry_creates_the_record_once(
    airtable: AirtableEmulator, base: str, patient: dict[str, Any]
) -> None:
    # Three 503s use up the helper's three attempts inside the runner's attempt.
    airtable.fail(503, method="POST", table="Triage", times=3)
    work_id = enqueue(KIND, TRIGGER)

    assert run_once().rescheduled == 1

    work = row(work_id)
    assert (work.status, work.attempt) == (Status.PENDING, 1)
    assert work.last_error == (
        "AirtableHTTPError: add_linked_record Triage: Airtable answered HTTP 503 "
        "SERVICE_UNAVAILABLE (transient; 3 attempts)"
    )
    assert work.checkpoints == {"create_sent": True}
    assert airtable.records(base, "Triage") == []
    assert len(creates(airtable)) == 3

    assert run_once().done == 0  # not due yet
    make_due(work_id)
    assert run_once().done == 1

    (record,) = airtable.records(base, "Triage")
    assert record["fields"]["Patient"] == [patient["id"]]
    assert len(creates(airtable)) == 4  # three refused, one accepted
    work = row(work_id)
    assert work.status == Status.DONE
    assert work.checkpoints["triage_record_id"] == record["id"]


def test_a_422_on_the_create_abandons_the_work_after_one_attempt(
    airtable: AirtableEmulator, base: str, patient: dict[str, Any]
) -> None:
    airtable.fail(422, method="POST", table="Triage", message='Field "Priority" cannot accept "urgent"')
    work_id = enqueue(KIND, TRIGGER)

    stats = run_once()

    assert (stats.done, stats.rescheduled, stats.abandoned) == (0, 0, 1)
    work = row(work_id)
    assert work.status == Status.ABANDONED
    assert len(creates(airtable)) == 1
    assert airtable.records(base, "Triage") == []
    assert work.last_error == (
        "AirtableHTTPError: add_linked_record Triage: Airtable answered HTTP 422 "
        "INVALID_VALUE_FOR_COLUMN (permanent; 1 attempt)"
    )
    for value in TRIGGER.values():
        assert value not in work.last_error

    make_due(work_id)
    assert run_once().done == 0  # abandoned work waits for an operator
    assert len(creates(airtable)) == 1


def test_a_lost_answer_to_the_create_does_not_create_the_record_twice(
    airtable: AirtableEmulator, base: str, patient: dict[str, Any]
) -> None:
    # Airtable creates the record, then the connection breaks before its answer arrives.
    airtable.reset_connection(method="POST", table="Triage", after_processing=True)
    work_id = enqueue(KIND, TRIGGER)

    assert run_once().rescheduled == 1

    (record,) = airtable.records(base, "Triage")
    assert len(creates(airtable)) == 1  # not retried inside the attempt
    work = row(work_id)
    assert work.status == Status.PENDING
    assert work.checkpoints == {"create_sent": True}
    assert work.last_error.startswith(
        "AirtableNetworkError: add_linked_record Triage: connection to Airtable lost before its answer"
    )

    make_due(work_id)
    assert run_once().done == 1

    assert airtable.records(base, "Triage") == [record]  # still exactly one
    assert len(creates(airtable)) == 1  # the retry looked it up instead of creating it
    assert row(work_id).checkpoints == {"create_sent": True, "triage_record_id": record["id"]}


def test_a_patient_record_that_does_not_exist_yet_walks_the_schedule(
    airtable: AirtableEmulator, base: str
) -> None:
    work_id = enqueue(KIND, TRIGGER)

    assert run_once().rescheduled == 1

    work = row(work_id)
    assert work.status == Status.PENDING
    assert work.last_error.startswith(
        "ReferenceNotFound: add_linked_record Triage: no record in table 'Patients'"
    )
    assert "P-17" not in work.last_error
    assert creates(airtable) == []

    patient = airtable.add(base, "Patients", {"Patient ID": "P-17"})
    make_due(work_id)
    assert run_once().done == 1

    (record,) = airtable.records(base, "Triage")
    assert record["fields"]["Patient"] == [patient["id"]]

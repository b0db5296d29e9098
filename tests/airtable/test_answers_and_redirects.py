"""Answers Airtable never sends (a listing without records, a redirect) and operations of
several requests (batches over 10 records), over real HTTP against the emulator."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nexus_workflows.airtable import (
    AirtableAnswerError,
    AirtableHTTPError,
    add_record,
    get_record_by_filter,
    get_records,
    get_table,
    update_record_by_filter,
    with_airtable_retry,
)
from nexus_workflows.exceptions import is_permanent
from tests.airtable.conftest import BASE
from tests.airtable.emulator import AirtableEmulator

PATIENT = "Maria Lopez"  # stands for patient data: must never reach messages, logs or other hosts


@pytest.fixture
def elsewhere() -> Iterator[AirtableEmulator]:
    """A second server: where a redirect points."""
    server = AirtableEmulator()
    yield server
    server.stop()


# --- a listing answered without its records ------------------------------------------------


@pytest.mark.parametrize(
    "body", [{}, {"status": "ok"}, {"error": {"type": "X"}}], ids=["empty", "other", "error"]
)
@pytest.mark.parametrize(
    "call",
    [
        lambda: get_record_by_filter(BASE, "Patients", {"Name": PATIENT}),
        lambda: get_records(BASE, "Patients", formula={"Name": PATIENT}),
        lambda: update_record_by_filter(BASE, "Patients", {"Name": PATIENT}, {"Status": "seen"}),
    ],
    ids=["get_record_by_filter", "get_records", "update_record_by_filter"],
)
def test_a_listing_answered_without_records_is_an_answer_error_not_no_match(
    airtable: AirtableEmulator, caplog: pytest.LogCaptureFixture, body: Any, call: Callable[[], Any]
) -> None:
    # A 200 from a proxy or a changed API was read as "no record matches": a look-up
    # before a create then created the record a second time.
    airtable.add(BASE, "Patients", {"Name": PATIENT})
    airtable.answer(body, method="GET")

    with caplog.at_level(logging.DEBUG), pytest.raises(AirtableAnswerError) as caught:
        call()

    assert caught.value.cause == "UnexpectedAnswer"
    assert (caught.value.transient, is_permanent(caught.value)) == (False, False)
    assert len(airtable.requests_for("GET")) == 1  # not retried
    assert airtable.writes() == []
    assert PATIENT not in str(caught.value)
    assert PATIENT not in caplog.text


def test_an_empty_listing_is_still_no_match(airtable: AirtableEmulator) -> None:
    airtable.answer({"records": []}, method="GET")
    assert get_record_by_filter(BASE, "Patients", {"Name": PATIENT}) is None


# --- redirects are not followed ------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirected_create_is_not_sent_on(
    airtable: AirtableEmulator, elsewhere: AirtableEmulator, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    # Followed, 307/308 re-sent the patient's fields to wherever Location pointed (another
    # host), and 301/302 turned the create into a read of that URL.
    airtable.fail(status, method="POST", location=f"{elsewhere.url}/v0/{BASE}/Patients")

    with caplog.at_level(logging.DEBUG), pytest.raises(AirtableHTTPError) as caught:
        add_record(BASE, "Patients", {"Name": PATIENT})

    error = caught.value
    assert (error.status, error.transient, error.permanent, error.attempts) == (status, False, False, 1)
    assert elsewhere.requests == []
    assert len(airtable.requests) == 1
    assert PATIENT not in str(error)
    assert PATIENT not in caplog.text


def test_a_redirect_loop_is_one_request_and_the_helpers_error(airtable: AirtableEmulator) -> None:
    # Followed, a loop was 31 requests on one start of the base's window, and ended in
    # requests' own TooManyRedirects, which no caller of the helpers expects.
    airtable.fail(302, method="GET", location=f"{airtable.url}/v0/{BASE}/Patients", times=100)

    with pytest.raises(AirtableHTTPError) as caught:
        get_record_by_filter(BASE, "Patients", {"Name": PATIENT})

    assert caught.value.status == 302
    assert len(airtable.requests) == 1


# --- operations of several requests --------------------------------------------------------


def records(count: int) -> list[dict[str, Any]]:
    return [{"Name": f"Patient {n}"} for n in range(count)]


@pytest.mark.parametrize("status", [429, 503])
def test_a_batch_that_must_not_run_twice_is_not_repeated_after_a_later_chunk_fails(
    airtable: AirtableEmulator, status: int
) -> None:
    # The first chunk was created; repeating the whole call created it again.
    airtable.fail(status, method="POST", after=1)

    with pytest.raises(AirtableHTTPError) as caught:
        with_airtable_retry(
            lambda: get_table(BASE, "Patients").batch_create(records(25)),
            "batch_create Patients",
            retry_network_errors=False,
        )

    assert caught.value.status == status
    assert caught.value.transient  # deferred work walks its schedule
    assert len(airtable.records(BASE, "Patients")) == 10  # the first chunk, once
    assert len(airtable.requests_for("POST")) == 2


def test_a_batch_that_must_not_run_twice_is_retried_while_nothing_went_through(
    airtable: AirtableEmulator,
) -> None:
    airtable.fail(503, method="POST")

    created = with_airtable_retry(
        lambda: get_table(BASE, "Patients").batch_create(records(25)),
        "batch_create Patients",
        retry_network_errors=False,
    )

    assert len(created) == 25
    assert len(airtable.records(BASE, "Patients")) == 25


def test_an_idempotent_batch_is_repeated_whole(airtable: AirtableEmulator) -> None:
    for n in range(25):
        airtable.add(BASE, "Patients", {"Ward": "3", "N": n})
    airtable.fail(503, method="PATCH", after=1)

    updated = update_record_by_filter(BASE, "Patients", {"Ward": "3"}, {"Status": "seen"})

    assert len(updated) == 25
    assert all(r["fields"]["Status"] == "seen" for r in airtable.records(BASE, "Patients"))
    # The first chunk, the second (refused), then all three chunks again.
    assert [len(r.body["records"]) for r in airtable.requests_for("PATCH")] == [10, 10, 10, 10, 5]


def test_the_helpers_client_takes_the_base_window_and_has_no_retries_of_its_own(
    airtable: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    airtable_config(airtable.url, AIRTABLE_MAX_ATTEMPTS=1)
    airtable.fail(429, method="POST", times=10)

    with pytest.raises(AirtableHTTPError):
        with_airtable_retry(lambda: get_table(BASE, "Patients").batch_create(records(3)), "batch")

    assert len(airtable.requests_for("POST")) == 1

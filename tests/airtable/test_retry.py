"""The retry policy, observed through real HTTP against the emulator."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests

from nexus_workflows.airtable import (
    AirtableAnswerError,
    AirtableError,
    AirtableHTTPError,
    AirtableNetworkError,
    add_record,
    get_record_by_filter,
    get_records,
    is_permanent_airtable_error,
    update_record_by_filter,
    with_airtable_retry,
)
from nexus_workflows.exceptions import is_permanent
from tests.airtable.conftest import BASE
from tests.airtable.emulator import API_KEY, AirtableEmulator

PATIENT = "Maria Lopez"  # stands for patient data: must never reach messages or logs


def retry_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if hasattr(r, "retry_delay")]


def test_429_then_success_retries_once_after_the_rate_limit_penalty(
    airtable: AirtableEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    airtable.add(BASE, "Patients", {"Name": "a"})
    airtable.fail(429, method="GET")

    with caplog.at_level(logging.WARNING, logger="nexus_workflows.airtable"):
        records = get_records(BASE, "Patients")

    assert [r["fields"] for r in records] == [{"Name": "a"}]
    assert len(airtable.requests_for("GET")) == 2
    (retry,) = retry_records(caplog)
    # The penalty (AIRTABLE_RATE_LIMIT_DELAY = 0.05 here) plus at most one base delay of jitter.
    assert 0.05 <= retry.retry_delay <= 0.05 + 0.01
    assert retry.airtable_status == 429


def test_retry_after_is_waited_instead_of_the_penalty(
    airtable: AirtableEmulator, airtable_config: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    airtable_config(airtable.url, AIRTABLE_RATE_LIMIT_DELAY=5)
    airtable.fail(429, method="GET", retry_after=0)

    with caplog.at_level(logging.WARNING, logger="nexus_workflows.airtable"):
        assert get_records(BASE, "Patients") == []

    assert len(airtable.requests_for("GET")) == 2
    (retry,) = retry_records(caplog)
    assert 0 <= retry.retry_delay <= 0.01  # Retry-After plus at most one base delay of jitter


def test_a_retry_after_longer_than_allowed_ends_the_call_with_a_transient_error(
    airtable: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    airtable_config(airtable.url, AIRTABLE_MAX_RETRY_AFTER=10)
    airtable.fail(429, method="GET", retry_after=120)

    with pytest.raises(AirtableHTTPError) as caught:
        get_records(BASE, "Patients")

    assert len(airtable.requests_for("GET")) == 1
    assert caught.value.status == 429
    assert caught.value.retry_after == 120
    assert caught.value.transient
    assert not caught.value.permanent


def test_503_three_times_gives_three_attempts_then_a_transient_error(airtable: AirtableEmulator) -> None:
    airtable.fail(503, method="GET", times=3)

    with pytest.raises(AirtableHTTPError) as caught:
        get_records(BASE, "Patients")

    error = caught.value
    assert len(airtable.requests_for("GET")) == 3
    assert (error.status, error.error_type, error.attempts) == (503, "SERVICE_UNAVAILABLE", 3)
    assert error.transient is True
    assert error.permanent is False
    assert not is_permanent(error)
    assert not is_permanent_airtable_error(error)
    assert str(error) == (
        "get_records Patients: Airtable answered HTTP 503 SERVICE_UNAVAILABLE (transient; 3 attempts)"
    )


@pytest.mark.parametrize("status", [500, 502, 504])
def test_other_transient_statuses_are_retried(airtable: AirtableEmulator, status: int) -> None:
    airtable.add(BASE, "Patients", {"Name": "a"})
    airtable.fail(status, method="GET")

    assert len(get_records(BASE, "Patients")) == 1
    assert [r.fault for r in airtable.requests_for("GET")] == ["status", None]


@pytest.mark.parametrize("status", [500, 502, 504])
def test_a_create_answered_with_an_error_that_may_follow_the_write_is_not_sent_again(
    airtable: AirtableEmulator, status: int
) -> None:
    """A gateway that timed out on Airtable's answer (504) or lost it (502), or an internal
    error after the write (500): the record may exist, so a create is not repeated in-process
    (that would make a second record); its workflow's own retry looks first."""
    airtable.fail(status, method="POST", after_processing=True)

    with pytest.raises(AirtableHTTPError) as caught:
        add_record(BASE, "Patients", {"Name": PATIENT})

    error = caught.value
    assert len(airtable.requests_for("POST")) == 1
    assert len(airtable.records(BASE, "Patients")) == 1
    assert (error.status, error.request_sent, error.transient, error.permanent) == (status, True, True, False)
    assert error.attempts == 1


@pytest.mark.parametrize("status", [408, 429, 503])
def test_a_create_refused_before_any_work_is_sent_again(airtable: AirtableEmulator, status: int) -> None:
    airtable.fail(status, method="POST", retry_after=0 if status == 429 else None)

    record = add_record(BASE, "Patients", {"Name": PATIENT})

    assert [r.fault for r in airtable.requests_for("POST")] == ["status", None]
    assert [r["id"] for r in airtable.records(BASE, "Patients")] == [record["id"]]


def test_a_408_is_transient_not_permanent(airtable: AirtableEmulator) -> None:
    """Request Timeout: the server gave up waiting for the request (a slow client or
    proxy); sent again it goes through. Abandoning the work for it would be wrong."""
    airtable.fail(408, method="GET", times=3)

    with pytest.raises(AirtableHTTPError) as caught:
        get_records(BASE, "Patients")

    assert len(airtable.requests_for("GET")) == 3
    assert (caught.value.transient, caught.value.permanent) == (True, False)
    assert not is_permanent(caught.value)
    assert not is_permanent_airtable_error(caught.value)


def test_a_503s_retry_after_is_waited(airtable: AirtableEmulator, caplog: pytest.LogCaptureFixture) -> None:
    airtable.fail(503, method="GET", retry_after="0.2")

    with caplog.at_level(logging.WARNING, logger="nexus_workflows.airtable"):
        assert get_records(BASE, "Patients") == []

    (retry,) = retry_records(caplog)
    assert 0.2 <= retry.retry_delay <= 0.21  # Retry-After and its jitter, not the 0.01 s back-off


@pytest.mark.parametrize("status", [500, 502, 504])
def test_a_retried_5xx_waits_its_retry_after(
    airtable: AirtableEmulator, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    """A read (safe to repeat) answered 500, 502 or 504 with Retry-After waits it, as
    after 429 and 503, not the few milliseconds of back-off."""
    airtable.add(BASE, "Patients", {"Name": "a"})
    airtable.fail(status, method="GET", retry_after="0.2")

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="nexus_workflows.airtable"):
        assert len(get_records(BASE, "Patients")) == 1

    assert time.monotonic() - started >= 0.2
    assert [r.fault for r in airtable.requests_for("GET")] == ["status", None]
    (retry,) = retry_records(caplog)
    assert 0.2 <= retry.retry_delay <= 0.21  # Retry-After and its jitter, not the 0.01 s back-off


@pytest.mark.parametrize("status", [500, 502, 504])
def test_a_5xx_retry_after_longer_than_allowed_ends_an_update(
    airtable: AirtableEmulator, airtable_config: Callable[..., None], status: int
) -> None:
    airtable_config(airtable.url, AIRTABLE_MAX_RETRY_AFTER=10)
    airtable.add(BASE, "Patients", {"Name": "a", "Status": "new"})
    airtable.fail(status, method="PATCH", retry_after=120)

    with pytest.raises(AirtableHTTPError) as caught:
        update_record_by_filter(BASE, "Patients", {"Name": "a"}, {"Status": "seen"})

    assert len(airtable.requests_for("PATCH")) == 1
    assert (caught.value.status, caught.value.retry_after, caught.value.transient) == (status, 120, True)


def test_backoff_doubles_from_the_base_delay_with_jitter(
    airtable: AirtableEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    airtable.fail(503, method="GET", times=2)

    with caplog.at_level(logging.WARNING, logger="nexus_workflows.airtable"):
        get_records(BASE, "Patients")

    first, second = (r.retry_delay for r in retry_records(caplog))
    assert 0.01 <= first <= 0.015  # AIRTABLE_RETRY_BASE_DELAY = 0.01, up to +50%
    assert 0.02 <= second <= 0.03


@pytest.mark.parametrize(
    ("status", "error_type"),
    [(422, "INVALID_VALUE_FOR_COLUMN"), (404, "NOT_FOUND"), (401, None), (403, None)],
)
def test_4xx_other_than_429_is_permanent_after_one_attempt(
    airtable: AirtableEmulator, status: int, error_type: str | None
) -> None:
    airtable.fail(status, method="POST", error_type=error_type)

    with pytest.raises(AirtableHTTPError) as caught:
        add_record(BASE, "Patients", {"Name": PATIENT})

    error = caught.value
    assert len(airtable.requests_for("POST")) == 1
    assert error.status == status
    assert error.permanent is True
    assert error.transient is False
    assert is_permanent(error)
    assert is_permanent_airtable_error(error)
    assert error.attempts == 1
    assert error.error_type == (error_type or airtable_default_type(status))
    assert airtable.records(BASE, "Patients") == []


def airtable_default_type(status: int) -> str:
    return {401: "AUTHENTICATION_REQUIRED", 403: "INVALID_PERMISSIONS_OR_MODEL_NOT_FOUND"}[status]


def test_a_wrong_api_key_is_permanent(airtable: AirtableEmulator, settings: Any) -> None:
    settings.AIRTABLE_API_KEY = "patWrongKey"

    with pytest.raises(AirtableHTTPError) as caught:
        get_records(BASE, "Patients")

    assert (caught.value.status, caught.value.error_type) == (401, "AUTHENTICATION_REQUIRED")
    assert caught.value.permanent is True


def test_errors_and_logs_carry_label_status_and_type_but_no_field_values(
    airtable: AirtableEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    # Airtable's messages can quote the rejected value; the helpers never repeat them.
    airtable.fail(422, method="POST", message=f'Cannot parse value "{PATIENT}" for field Name')
    airtable.fail(503, method="GET", times=3)

    with caplog.at_level(logging.DEBUG, logger="nexus_workflows"):
        with pytest.raises(AirtableHTTPError) as create_error:
            add_record(BASE, "Patients", {"Name": PATIENT})
        with pytest.raises(AirtableHTTPError) as lookup_error:
            get_record_by_filter(BASE, "Patients", {"Name": PATIENT})

    for error in (create_error.value, lookup_error.value):
        # Not chained to the requests exception, whose message holds the URL and formula.
        assert error.__cause__ is None
        assert error.__suppress_context__ is True
        assert PATIENT not in str(error)
        assert "Maria" not in repr(error.args)
    assert str(create_error.value).startswith("add_record Patients: Airtable answered HTTP 422")
    assert "INVALID_VALUE_FOR_COLUMN" in str(create_error.value)
    assert str(lookup_error.value).startswith("get_record_by_filter Patients: Airtable answered HTTP 503")
    # (urllib3's own DEBUG log prints request URLs, formula included: keep it off in
    # production, as the project's LOGGING does.)
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("nexus_workflows")]
    assert len(ours) == 4, "the failure of the create, two retries and the final failure are logged"
    assert not [message for message in ours if "Maria" in message]


def test_a_connection_reset_on_a_create_is_not_retried(airtable: AirtableEmulator) -> None:
    # The request was carried out and only the answer was lost: retrying would create
    # a second record.
    airtable.reset_connection(method="POST", after_processing=True)

    with pytest.raises(AirtableNetworkError) as caught:
        add_record(BASE, "Patients", {"Name": PATIENT})

    error = caught.value
    assert len(airtable.requests_for("POST")) == 1
    assert len(airtable.records(BASE, "Patients")) == 1
    assert error.request_sent is True
    assert error.transient is True
    assert error.permanent is False
    assert error.attempts == 1
    assert "ConnectionResetError" in error.cause or "RemoteDisconnected" in error.cause
    assert PATIENT not in str(error)


def test_a_read_timeout_on_a_create_is_not_retried(
    airtable: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    airtable_config(airtable.url, AIRTABLE_TIMEOUT=(2, 0.3))
    airtable.stall(2, method="POST")

    with pytest.raises(AirtableNetworkError) as caught:
        add_record(BASE, "Patients", {"Name": "a"})

    assert len(airtable.requests_for("POST")) == 1
    assert caught.value.request_sent is True
    assert caught.value.cause.startswith("ReadTimeout")


def test_a_connection_reset_on_a_read_is_retried(airtable: AirtableEmulator) -> None:
    airtable.add(BASE, "Patients", {"Name": "a"})
    airtable.reset_connection(method="GET")

    assert get_record_by_filter(BASE, "Patients", {"Name": "a"}) is not None
    assert [r.fault for r in airtable.requests_for("GET")] == ["reset", None]


def test_a_connection_reset_on_an_update_is_retried(airtable: AirtableEmulator) -> None:
    # An update sets the same values again: repeating it is harmless.
    airtable.add(BASE, "Patients", {"Name": "a", "Status": "new"})
    airtable.reset_connection(method="PATCH", after_processing=True)

    updated = update_record_by_filter(BASE, "Patients", {"Name": "a"}, {"Status": "seen"})

    assert [r["fields"]["Status"] for r in updated] == ["seen"]
    assert [r.fault for r in airtable.requests_for("PATCH")] == ["reset", None]


def test_a_refused_connection_is_retried_even_for_a_create(
    refused: AirtableEmulator, airtable_config: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    airtable_config(refused.url)

    with (
        caplog.at_level(logging.WARNING, logger="nexus_workflows.airtable"),
        pytest.raises(AirtableNetworkError) as caught,
    ):
        add_record(BASE, "Patients", {"Name": "a"})

    error = caught.value
    assert error.attempts == 3
    assert len(retry_records(caplog)) == 2
    assert error.request_sent is False
    assert error.transient is True
    assert error.permanent is False
    assert "ConnectionRefusedError" in error.cause
    assert str(error).startswith("add_record Patients: could not connect to Airtable")


def test_a_create_goes_through_once_airtable_accepts_connections_again(
    refused: AirtableEmulator, airtable_config: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    airtable_config(refused.url)

    class ListenOnFirstRetry(logging.Handler):
        # The retry is logged before its back-off sleep: the port starts listening then.
        def emit(self, record: logging.LogRecord) -> None:
            if hasattr(record, "retry_delay") and refused._thread is None:
                refused.start_listening()

    handler = ListenOnFirstRetry()
    logger = logging.getLogger("nexus_workflows.airtable.retry")
    logger.addHandler(handler)
    try:
        record = add_record(BASE, "Patients", {"Name": "a"})
    finally:
        logger.removeHandler(handler)

    assert record is not None
    assert [r["id"] for r in refused.records(BASE, "Patients")] == [record["id"]]
    assert len(refused.requests_for("POST")) == 1  # the refused attempt never arrived


def test_pyairtables_own_retries_are_switched_off(
    airtable: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    # With pyairtable's default strategy a 429 would be retried five more times below us.
    airtable_config(airtable.url, AIRTABLE_MAX_ATTEMPTS=1)
    airtable.fail(429, method="POST", times=10)

    with pytest.raises(AirtableHTTPError):
        add_record(BASE, "Patients", {"Name": "a"})

    assert len(airtable.requests_for("POST")) == 1


def test_with_airtable_retry_wraps_any_requests_call(airtable: AirtableEmulator) -> None:
    airtable.fail(502, method="GET")
    url = f"{airtable.url}/v0/{BASE}/Patients"

    def call() -> Any:
        response = requests.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
        response.raise_for_status()
        return response.json()

    assert with_airtable_retry(call, "custom list") == {"records": []}
    assert len(airtable.requests_for("GET")) == 2


def test_with_airtable_retry_raises_other_errors_at_once() -> None:
    calls = []

    def broken() -> None:
        calls.append(1)
        raise KeyError("id")

    with pytest.raises(KeyError):
        with_airtable_retry(broken, "broken")
    assert calls == [1]


def test_with_airtable_retry_does_not_retry_an_already_retried_helper(airtable: AirtableEmulator) -> None:
    airtable.fail(503, method="GET", times=5)

    with pytest.raises(AirtableHTTPError) as caught:
        with_airtable_retry(lambda: get_records(BASE, "Patients"), "outer")

    assert len(airtable.requests_for("GET")) == 3  # not 9
    assert caught.value.label == "get_records Patients"


def test_with_airtable_retry_without_network_retries_still_retries_http_errors(
    airtable: AirtableEmulator,
) -> None:
    airtable.fail(503, method="GET")
    url = f"{airtable.url}/v0/{BASE}/Patients"

    def call() -> int:
        response = requests.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
        response.raise_for_status()
        return response.status_code

    assert with_airtable_retry(call, "custom", retry_network_errors=False) == 200


def test_is_permanent_airtable_error_reads_raw_requests_errors(airtable: AirtableEmulator) -> None:
    url = f"{airtable.url}/v0/{BASE}/Patients"
    errors: dict[int, requests.HTTPError] = {}
    for status in (422, 429, 500):
        airtable.fail(status, method="GET")
        with pytest.raises(requests.HTTPError) as caught:
            requests.get(url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5).raise_for_status()
        errors[status] = caught.value

    assert is_permanent_airtable_error(errors[422]) is True
    assert is_permanent_airtable_error(errors[429]) is False
    assert is_permanent_airtable_error(errors[500]) is False
    assert is_permanent_airtable_error(ValueError("x")) is False


def test_every_failure_of_airtable_is_an_airtable_error_and_a_callers_mistake_is_not(
    airtable: AirtableEmulator,
) -> None:
    import nexus_workflows.airtable as helpers

    airtable.fail(500, method="GET", times=3)
    with pytest.raises(AirtableError):  # not requests' own HTTPError
        get_records(BASE, "Patients")
    # What Airtable (or the way to it) did: one except clause catches them all.
    failures = {"AirtableHTTPError", "AirtableNetworkError", "AirtableAnswerError", "ReferenceNotFound"}
    # What the caller got wrong (arguments, settings): a bug to fix, not a failure to retry.
    mistakes = {"InvalidAirtableArgument", "InvalidFormula", "InvalidLink", "AirtableNotConfigured"}
    exported = {
        name
        for name in helpers.__all__
        if isinstance(getattr(helpers, name), type) and issubclass(getattr(helpers, name), Exception)
    } - {"AirtableError"}
    assert exported == failures | mistakes
    assert {name for name in exported if issubclass(getattr(helpers, name), AirtableError)} == failures


# --- a success whose answer is not of Airtable's shape -------------------------------------

NO_CREATED_TIME = {"id": "rec1", "fields": {"Name": PATIENT, "Phone": "+52 55 1234 5678"}}


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        ({"records": [NO_CREATED_TIME]}, "ValidationError"),  # pydantic quotes the record
        ({"records": PATIENT}, "TypeError"),
        ({"records": [PATIENT]}, "TypeError"),
        (f"<html>{PATIENT}</html>".encode(), "JSONDecodeError"),
        (b"", "AttributeError"),  # pyairtable reads an empty body as None
    ],
    ids=["no createdTime", "records not a list", "record not a dict", "not JSON", "empty"],
)
def test_a_read_answered_in_an_unexpected_shape_is_the_helpers_error_without_the_answer(
    airtable: AirtableEmulator, caplog: pytest.LogCaptureFixture, body: Any, cause: str
) -> None:
    airtable.answer(body, method="GET")

    with caplog.at_level(logging.DEBUG), pytest.raises(AirtableAnswerError) as caught:
        get_record_by_filter(BASE, "Patients", {"Patient ID": "P-17"})

    error = caught.value
    assert str(error) == (
        "get_record_by_filter Patients: Airtable answered, but the answer did not have the "
        f"expected shape ({cause}; 1 attempt)"
    )
    assert (error.cause, error.transient, error.permanent, error.status) == (cause, False, False, None)
    # Not chained: the parser's message quotes the answer.
    assert error.__cause__ is None
    assert error.__suppress_context__
    assert len(airtable.requests_for("GET")) == 1  # not retried
    assert PATIENT not in caplog.text
    assert "1234" not in caplog.text


def test_a_create_answered_without_created_time_is_not_sent_again(
    airtable: AirtableEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    airtable.answer(NO_CREATED_TIME, method="POST")

    with caplog.at_level(logging.DEBUG), pytest.raises(AirtableAnswerError) as caught:
        add_record(BASE, "Patients", {"Name": PATIENT})

    assert caught.value.cause == "ValidationError"
    assert PATIENT not in str(caught.value)
    assert PATIENT not in caplog.text
    assert len(airtable.requests_for("POST")) == 1


def test_a_callers_own_error_before_any_answer_is_not_taken_for_an_answer(airtable: AirtableEmulator) -> None:
    def caller_bug() -> None:
        raise TypeError("the caller's own bug")

    with pytest.raises(TypeError, match="the caller's own bug"):
        with_airtable_retry(caller_bug, "custom")
    assert airtable.requests == []


def test_an_endpoint_url_requests_cannot_use_is_not_configured_and_never_quoted(
    airtable_config: Callable[..., None],
) -> None:
    # Past check E200 (a project that does not run checks): requests' InvalidURL quoted it.
    from nexus_workflows.airtable import AirtableNotConfigured

    airtable_config("https://user:s3cret@api.airtable.com:99999")
    with pytest.raises(AirtableNotConfigured, match="AIRTABLE_ENDPOINT_URL") as caught:
        get_records(BASE, "Patients")
    assert "s3cret" not in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__
    assert not is_permanent(caught.value)

"""The waits between attempts (retry.py): jitter on top of ``Retry-After``, and
``AIRTABLE_RETRY_DEADLINE`` over all the retries of one call, through real HTTP against
the emulator.

No bound in seconds from above: the waits are read from the retry log's ``retry_delay``
(what the policy chose), the emulator's arrival times only bound them from below.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import pairwise

import pytest

from nexus_workflows.airtable import AirtableHTTPError, get_records
from tests.airtable.conftest import BASE
from tests.airtable.emulator import AirtableEmulator

RETRY_AFTER = 0.05
JITTER = 0.01  # AIRTABLE_RETRY_BASE_DELAY of the tests' settings (conftest.FAST_SETTINGS)


def retry_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [r.retry_delay for r in caplog.records if hasattr(r, "retry_delay")]


def given_up(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage().split("; giving up: ")[1] for r in caplog.records if "; giving up: " in r.getMessage()
    ]


@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_after_is_waited_with_jitter_and_never_less(
    airtable: AirtableEmulator,
    airtable_config: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    """Workers told the same Retry-After must not all come back in the same instant: each
    wait is Retry-After plus up to AIRTABLE_RETRY_BASE_DELAY, drawn afresh."""
    airtable_config(airtable.url, AIRTABLE_MAX_ATTEMPTS=6)
    airtable.fail(status, method="GET", retry_after=str(RETRY_AFTER), times=5)

    with caplog.at_level(logging.WARNING, logger="nexus_workflows.airtable"):
        assert get_records(BASE, "Patients") == []

    delays = retry_delays(caplog)
    assert len(delays) == 5
    assert all(RETRY_AFTER <= delay <= RETRY_AFTER + JITTER for delay in delays), delays
    assert len(set(delays)) == 5, delays  # jittered: Retry-After alone gives five equal waits
    arrivals = [r.received_at for r in airtable.requests_for("GET")]
    assert all(later - earlier >= RETRY_AFTER for earlier, later in pairwise(arrivals))


def test_a_retry_that_would_start_after_the_deadline_ends_the_call_at_once(
    airtable: AirtableEmulator, airtable_config: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    """A Retry-After within AIRTABLE_MAX_RETRY_AFTER but beyond what is left of the call's
    AIRTABLE_RETRY_DEADLINE is not waited: the call ends with the 503, transient (deferred
    work walks its schedule), after one request."""
    airtable_config(airtable.url, AIRTABLE_RETRY_DEADLINE=0.5, AIRTABLE_MAX_RETRY_AFTER=60)
    airtable.fail(503, method="GET", retry_after=30, times=3)

    with (
        caplog.at_level(logging.WARNING, logger="nexus_workflows.airtable"),
        pytest.raises(AirtableHTTPError) as caught,
    ):
        get_records(BASE, "Patients")

    assert len(airtable.requests_for("GET")) == 1
    assert (caught.value.status, caught.value.attempts, caught.value.transient) == (503, 1, True)
    assert caught.value.permanent is False
    assert retry_delays(caplog) == []
    assert given_up(caplog) == ["the next attempt would start after AIRTABLE_RETRY_DEADLINE"]


def test_retries_stop_at_the_deadline_with_attempts_left(
    airtable: AirtableEmulator, airtable_config: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    """Fifty attempts allowed, a 503 with Retry-After 0.1 s every time: the retries stop
    once the next one would start past the 0.5 s deadline, whatever the attempts left.
    Their waits add up to under the deadline; the requests' own time (longer on a loaded
    machine) only means fewer of them."""
    airtable_config(airtable.url, AIRTABLE_MAX_ATTEMPTS=50, AIRTABLE_RETRY_DEADLINE=0.5)
    airtable.fail(503, method="GET", retry_after="0.1", times=50)

    with (
        caplog.at_level(logging.WARNING, logger="nexus_workflows.airtable"),
        pytest.raises(AirtableHTTPError) as caught,
    ):
        get_records(BASE, "Patients")

    attempts = len(airtable.requests_for("GET"))
    assert 1 <= attempts <= 5  # at most four waits of 0.1-0.11 s fit in 0.5 s
    assert caught.value.attempts == attempts
    delays = retry_delays(caplog)
    assert len(delays) == attempts - 1
    assert sum(delays) <= 0.5
    assert given_up(caplog) == ["the next attempt would start after AIRTABLE_RETRY_DEADLINE"]

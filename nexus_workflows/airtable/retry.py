"""The one retry policy of every Airtable call: :func:`with_airtable_retry`.

pyairtable's own ``retry_strategy`` is switched off (see :mod:`.client`), so these rules
are the only ones:

* at most ``AIRTABLE_MAX_ATTEMPTS`` requests (default 3);
* transient: HTTP 408, 429, 500, 502, 503, 504 and network failures. After 429 or a 5xx
  that sends one, the wait is ``Retry-After`` (at most ``AIRTABLE_MAX_RETRY_AFTER``), else
  after 429 its 30-second penalty (``AIRTABLE_RATE_LIMIT_DELAY``), each plus up to
  ``AIRTABLE_RETRY_BASE_DELAY`` of jitter (never less than Airtable asked); other transient
  failures back off exponentially from ``AIRTABLE_RETRY_BASE_DELAY`` with jitter;
* no retry starts later than ``AIRTABLE_RETRY_DEADLINE`` seconds after the call began: a
  wait that would end past it ends the call at once with the failure in hand;
* a failure after which the request may have been carried out — a network failure once it
  may have reached Airtable (connection reset, read timeout, the request's
  ``AIRTABLE_TIMEOUT`` passed: see :mod:`.deadline`), or HTTP 500, 502, 504 (an internal
  or a gateway's error can come after the write) — is retried only when the operation is
  safe to repeat (``retry_network_errors=True``); a failure to connect, 408, 429 and 503
  are always retried;
* an operation that is not safe to repeat is not repeated either once one of its
  requests was answered (a batch over 10 records whose second chunk failed: the first
  chunk is done);
* a redirect is not followed (see :mod:`.client`): an :class:`AirtableHTTPError` with
  the 3xx status, neither retried nor permanent;
* anything else, or the last attempt's failure, is raised; a 4xx other than 429 carries
  ``permanent = True``;
* a success whose answer pyairtable cannot read (not JSON, a record without
  ``createdTime``...) is :class:`AirtableAnswerError`, not retried: the parser's message
  quotes the answer, record fields included.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

import pydantic
import requests
import urllib3.exceptions

from nexus_workflows.airtable.client import UnexpectedAnswer, answers_received
from nexus_workflows.airtable.exceptions import (
    AirtableAnswerError,
    AirtableError,
    AirtableHTTPError,
    AirtableNetworkError,
    AirtableNotConfigured,
    InvalidAirtableArgument,
)
from nexus_workflows.conf import app_settings
from nexus_workflows.exceptions import WorkflowError

logger = logging.getLogger(__name__)

T = TypeVar("T")

RATE_LIMITED = 429
TRANSIENT_STATUSES = frozenset({408, RATE_LIMITED, 500, 502, 503, 504})
#: Statuses whose ``Retry-After`` is waited when retried (Airtable's rate limit; a server
#: or gateway error: a service that says when to come back is asking for that much).
WAITS_RETRY_AFTER = frozenset({RATE_LIMITED, 500, 502, 503, 504})

# Airtable's error types are upper-case identifiers. Anything else in that slot (an
# HTML page from a proxy, a message) is not repeated, since it could echo request data.
_ERROR_TYPE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
# What requests raises for an endpoint URL it cannot use, before anything is sent.
_UNUSABLE_URL = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
    requests.exceptions.URLRequired,
)


def is_permanent_airtable_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an Airtable answer that retrying cannot fix: HTTP 4xx except 408
    and 429.

    Accepts the helpers' :class:`AirtableHTTPError` and a raw ``requests.HTTPError``.
    """
    status = _status_of(exc)
    return status is not None and 400 <= status < 500 and status not in TRANSIENT_STATUSES


def with_airtable_retry(operation: Callable[[], T], label: str, *, retry_network_errors: bool = True) -> T:
    """Call ``operation()`` (one Airtable request, or a few for a paged read) under the
    retry policy and return its result.

    ``label`` names the call in logs and errors (for example ``"add_record Patients"``);
    it must not contain patient data. Pass ``retry_network_errors=False`` for an
    operation that must not run twice, such as a create: a lost response can hide a
    record that was created; and once a request of the operation was answered (the
    first chunk of a batch of the helpers' client), it is not repeated at all.

    Failures from ``requests`` are raised as :class:`AirtableHTTPError` or
    :class:`AirtableNetworkError`, with messages free of field values; an answer
    pyairtable cannot read as :class:`AirtableAnswerError` (a ``TypeError``,
    ``ValueError``, ``LookupError`` or ``AttributeError`` counts as one only when raised
    after the helpers' client received an answer in this call). An
    :class:`AirtableError` raised inside ``operation`` (a nested helper, which already
    retried) and every other exception propagate unchanged, without a retry.
    """
    max_attempts = app_settings.AIRTABLE_MAX_ATTEMPTS
    # Monotonic: a wall-clock step must not stretch or cut the call's retries.
    deadline = time.monotonic() + float(app_settings.AIRTABLE_RETRY_DEADLINE)
    attempt = 0
    while True:
        attempt += 1
        answers = answers_received()
        try:
            return operation()
        except _UNUSABLE_URL:
            raise _unusable_url(label) from None  # requests' message quotes the URL
        except Exception as exc:
            error = _error_of(exc, label, attempt, answers)
            if error is None:
                raise
            # A request of this attempt was answered: an operation of several requests
            # (a batch over 10 records) has carried out part of its writes.
            partly_done = answers_received() != answers
        retryable = error.transient and (retry_network_errors or (not partly_done and not error.request_sent))
        delay, reason = _next_wait(error, attempt, max_attempts, deadline, retryable, partly_done)
        if delay is None:
            _log_failure(error, reason)
            # Not chained: the requests exception's message holds the URL and formula.
            raise error from None
        logger.warning(
            "%s; retrying in %.2fs (attempt %d of %d)",
            error,
            delay,
            attempt + 1,
            max_attempts,
            extra={
                "airtable_label": label,
                "airtable_status": error.status,
                "airtable_error_type": error.error_type,
                "retry_delay": delay,
            },
        )
        time.sleep(delay)


def _next_wait(
    error: AirtableError, attempt: int, max_attempts: int, deadline: float, retryable: bool, partly_done: bool
) -> tuple[float | None, str]:
    """``(seconds to wait before the next attempt, "")``, or ``(None, why the call ends now)``."""
    if not retryable:
        if error.transient and partly_done:
            return None, "part of the operation was carried out and it is not safe to repeat"
        if error.transient:
            return None, "the request may have been carried out by Airtable and is not safe to repeat"
        return None, "not retryable"
    if attempt >= max_attempts:
        return None, "no attempts left"
    delay = _delay(error, attempt)
    if delay is None:
        return None, "Retry-After is longer than AIRTABLE_MAX_RETRY_AFTER"
    if time.monotonic() + delay > deadline:
        return None, "the next attempt would start after AIRTABLE_RETRY_DEADLINE"
    return delay, ""


def _unusable_url(label: str) -> AirtableNotConfigured:
    """The error of an endpoint URL requests cannot use, without the URL (a password in it
    too). Not permanent, as a missing key is not: a fixed deployment carries on by itself."""
    return AirtableNotConfigured(
        f"{label}: no request can be built on NEXUS_WORKFLOWS['AIRTABLE_ENDPOINT_URL'] "
        "(requests refused the URL); `manage.py check` says what is wrong with it (E200)"
    )


def _error_of(exc: Exception, label: str, attempt: int, answers: int) -> AirtableError | None:
    """The helpers' error for a failed attempt, or ``None`` to let ``exc`` propagate as it is."""
    if isinstance(exc, AirtableError | WorkflowError | InvalidAirtableArgument):
        return None  # a nested helper's (already retried), or a misuse: unchanged
    if isinstance(exc, requests.exceptions.JSONDecodeError | pydantic.ValidationError | UnexpectedAnswer):
        # A success pyairtable could not read (JSONDecodeError is a RequestException too);
        # the parser's message quotes the answer, record fields included.
        return AirtableAnswerError(label=label, cause=type(exc).__name__, attempts=attempt)
    if isinstance(exc, requests.RequestException):
        return _classify(exc, label, attempt)
    reading = isinstance(exc, TypeError | ValueError | LookupError | AttributeError)
    if reading and answers_received() != answers:
        # After an answer arrived, pyairtable failing to read it; before, the caller's own.
        return AirtableAnswerError(label=label, cause=type(exc).__name__, attempts=attempt)
    return None


def _classify(exc: requests.RequestException, label: str, attempt: int) -> AirtableError | None:
    """The helpers' error for a failure from ``requests``, or ``None`` when it is not an
    HTTP or network failure (a bad URL, a missing schema...)."""
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        response = exc.response
        status = response.status_code
        transient = status in TRANSIENT_STATUSES
        return AirtableHTTPError(
            label=label,
            status=status,
            error_type=_error_type(response),
            attempts=attempt,
            retry_after=_retry_after(response) if status in WAITS_RETRY_AFTER else None,
            transient=transient,
            permanent=not transient and 400 <= status < 500,
        )
    if isinstance(exc, requests.TooManyRedirects) and exc.response is not None:
        # The helpers' client follows no redirect (a caller's own session gave up after
        # its limit): Airtable's API does not redirect, so the endpoint is misconfigured
        # or a proxy is in the way. Not permanent: a fixed deployment carries on.
        return AirtableHTTPError(
            label=label,
            status=exc.response.status_code,
            error_type=None,
            attempts=attempt,
            transient=False,
            permanent=False,
        )
    if isinstance(exc, requests.exceptions.RetryError):
        # Only from a session with a urllib3 retry policy of its own (not ours): it
        # gave up on rate limiting.
        return AirtableHTTPError(
            label=label,
            status=RATE_LIMITED,
            error_type=None,
            attempts=attempt,
            transient=True,
            permanent=False,
        )
    failure = _network_failure(exc)
    if failure is None:
        return None
    description, request_sent = failure
    return AirtableNetworkError(
        label=label,
        failure=description,
        cause=_cause_name(exc),
        request_sent=request_sent,
        attempts=attempt,
    )


def _network_failure(exc: requests.RequestException) -> tuple[str, bool] | None:
    """``(description, request may have reached Airtable)`` for a network failure."""
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return "timed out connecting to Airtable", False
    if isinstance(exc, requests.ConnectionError):
        reason = exc.args[0] if exc.args else None
        if isinstance(reason, urllib3.exceptions.MaxRetryError):
            reason = reason.reason
        # NewConnectionError (refused, unreachable, DNS) is a ConnectTimeoutError too:
        # no byte of the request was sent.
        if isinstance(reason, urllib3.exceptions.ConnectTimeoutError):
            return "could not connect to Airtable", False
        # Reset or closed after the request was (perhaps) sent; TLS and proxy failures
        # land here too, conservatively.
        return "connection to Airtable lost before its answer", True
    if isinstance(exc, requests.Timeout):
        return "timed out waiting for Airtable's answer", True
    if isinstance(exc, requests.exceptions.ChunkedEncodingError | requests.exceptions.ContentDecodingError):
        return "Airtable's answer was cut off", True
    return None


def _cause_name(exc: BaseException) -> str:
    """The innermost exception class behind a ``requests`` failure (such as
    ``ConnectionRefusedError``): useful, and free of the URL its message would carry."""
    names = [type(exc).__name__]
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        nested = next((arg for arg in current.args if isinstance(arg, BaseException)), None)
        if isinstance(current, urllib3.exceptions.MaxRetryError):
            nested = current.reason
        current = nested or current.__cause__ or current.__context__
        if current is not None:
            names.append(type(current).__name__)
    return " < ".join(dict.fromkeys(names))


def _error_type(response: requests.Response) -> str | None:
    """Airtable's error type from ``{"error": {"type": ...}}`` or ``{"error": "..."}``."""
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        error = error.get("type")
    if isinstance(error, str) and _ERROR_TYPE.fullmatch(error):
        return error
    return None


def _retry_after(response: requests.Response) -> float | None:
    """``Retry-After`` in seconds (a number or an HTTP date), or ``None``."""
    value = response.headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(seconds, 0.0)


def _delay(error: AirtableError, attempt: int) -> float | None:
    """Seconds to wait before the next attempt, or ``None`` to stop retrying now."""
    base = float(app_settings.AIRTABLE_RETRY_BASE_DELAY)
    retry_after = getattr(error, "retry_after", None)
    # A little jitter on top of Airtable's wait (never under it), so workers told the same
    # Retry-After, or penalised together, do not all return at the same instant.
    if retry_after is not None:
        if retry_after > app_settings.AIRTABLE_MAX_RETRY_AFTER:
            return None
        return retry_after + random.uniform(0, base)
    if error.status == RATE_LIMITED:
        return float(app_settings.AIRTABLE_RATE_LIMIT_DELAY) + random.uniform(0, base)
    backoff = base * 2 ** (attempt - 1)
    return backoff * random.uniform(1.0, 1.5)


def _log_failure(error: AirtableError, reason: str) -> None:
    logger.warning(
        "%s; giving up: %s",
        error,
        reason,
        extra={
            "airtable_label": error.label,
            "airtable_status": error.status,
            "airtable_error_type": error.error_type,
        },
    )


def _status_of(exc: BaseException) -> int | None:
    if isinstance(exc, AirtableError):
        return exc.status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None

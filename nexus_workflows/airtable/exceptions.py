"""Exceptions of the Airtable helpers.

Failures of a call to Airtable are :class:`AirtableError` subclasses whose message names
the helper's label, the HTTP status and Airtable's error type (or the kind of network
failure), never a field value, a formula or a URL: those may carry patient data. The
exception from ``requests`` is not chained into them for the same reason (its message
holds the request URL, filter formula included).

``permanent`` follows the runner's convention (see :func:`nexus_workflows.exceptions.is_permanent`):
``True`` abandons deferred work at once, anything else walks the retry schedule.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured


class AirtableError(Exception):
    """A call to Airtable failed after the retries it was allowed."""

    #: Retrying later cannot help (HTTP 4xx other than 408 and 429).
    permanent: bool = False
    #: The failure was of a kind that is retried (408, 429, 5xx, network), even if this
    #: call ran out of attempts.
    transient: bool = False
    #: The HTTP status of Airtable's answer, if there was one.
    status: int | None = None
    #: Airtable's error type (such as ``INVALID_VALUE_FOR_COLUMN``), if it sent one.
    error_type: str | None = None
    #: Whether Airtable may have carried the request out although the call failed (its
    #: answer lost): an operation that must not run twice is then not repeated.
    request_sent: bool = False

    def __init__(self, message: str, *, label: str, attempts: int) -> None:
        super().__init__(message)
        self.label = label
        self.attempts = attempts


#: HTTP statuses after which a request may have been carried out (see
#: ``AirtableHTTPError.request_sent``); every other status says it was not (429, 503 and
#: 408 refuse it before any work; a 4xx refuses it).
MAY_HAVE_BEEN_CARRIED_OUT = frozenset({500, 502, 504})


class AirtableHTTPError(AirtableError):
    """Airtable (or a proxy in front of it) answered with an HTTP error status."""

    def __init__(
        self,
        *,
        label: str,
        status: int,
        error_type: str | None,
        attempts: int,
        retry_after: float | None = None,
        transient: bool,
        permanent: bool,
    ) -> None:
        self.status = status
        self.error_type = error_type
        self.retry_after = retry_after
        self.transient = transient
        self.permanent = permanent
        #: Whether Airtable may have carried the request out: an internal error (500) or a
        #: gateway's (502, 504) can come after the write, and only its answer was lost.
        self.request_sent = status in MAY_HAVE_BEEN_CARRIED_OUT
        nature = "permanent" if permanent else "transient" if transient else "not retried"
        super().__init__(
            f"{label}: Airtable answered HTTP {status} {error_type or '(no error type)'} "
            f"({nature}; {_attempts(attempts)})",
            label=label,
            attempts=attempts,
        )


class AirtableNetworkError(AirtableError):
    """No HTTP answer: the connection failed, broke or timed out."""

    transient = True

    def __init__(self, *, label: str, failure: str, cause: str, request_sent: bool, attempts: int) -> None:
        self.failure = failure
        self.cause = cause
        #: Whether the request may have reached Airtable (so a create may have happened).
        self.request_sent = request_sent
        super().__init__(
            f"{label}: {failure} ({cause}; {_attempts(attempts)})", label=label, attempts=attempts
        )


class AirtableAnswerError(AirtableError):
    """Airtable (or something in front of it) answered with success, but the answer did
    not have the shape of Airtable's API: not JSON, a record without ``createdTime``...

    Neither transient nor permanent: the call is not repeated in-process (the request was
    carried out, so a create may have happened), and deferred work walks its schedule.
    The message names the parser's exception type only; the parser's own message quotes
    the answer, record fields included.
    """

    def __init__(self, *, label: str, cause: str, attempts: int) -> None:
        self.cause = cause
        super().__init__(
            f"{label}: Airtable answered, but the answer did not have the expected shape "
            f"({cause}; {_attempts(attempts)})",
            label=label,
            attempts=attempts,
        )


class ReferenceNotFound(AirtableError, LookupError):
    """``add_linked_record`` found no record for its link; nothing was created.

    Not permanent: the referenced record may be created later, so deferred work walks
    its retry schedule.
    """

    permanent = False
    transient = True

    def __init__(self, *, label: str, table: str, field: str) -> None:
        self.table = table
        self.field = field
        super().__init__(
            f"{label}: no record in table {table!r} matches the link's formula, so link field "
            f"{field!r} cannot be filled; nothing was created",
            label=label,
            attempts=1,
        )


class InvalidAirtableArgument(ValueError):
    """A helper was called with an argument it cannot use; nothing was sent.

    Permanent: the same call fails the same way on every retry.
    """

    permanent = True


class InvalidFormula(InvalidAirtableArgument, TypeError):
    """A formula is not a pyairtable formula object or a ``{field: value}`` dict of
    literal values."""


class InvalidLink(InvalidAirtableArgument, TypeError):
    """The ``link`` of ``add_linked_record`` is not a usable :class:`LinkSpec`."""


class AirtableNotConfigured(ImproperlyConfigured):
    """No Airtable API key is configured.

    Not permanent: deferred work walks its schedule, so it carries on by itself once
    the key is deployed.
    """


def _attempts(count: int) -> str:
    return f"{count} attempt" if count == 1 else f"{count} attempts"

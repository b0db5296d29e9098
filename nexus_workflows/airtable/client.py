"""The pyairtable client behind the helpers, built from the settings.

pyairtable's own retry strategy is switched off (``retry_strategy=None``) so that
:func:`~nexus_workflows.airtable.retry.with_airtable_retry` is the only retry policy:
its default would retry 429 five more times (POST included) underneath ours.

Redirects are not followed: Airtable's API does not redirect, and following one would
send the request again, unmetered, to wherever ``Location`` points (307/308 with its
body, patient fields included, even to another host), or turn a create into a read
(301/302).

``AIRTABLE_TIMEOUT`` bounds each request as a whole (:mod:`.deadline`): requests' own
timeouts bound each wait on the socket, so a server sending a byte a second would keep
a call, and the runner's thread with its claim kept alive by heartbeats, indefinitely.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from pyairtable import Api, Table
from urllib3.util import Timeout

from nexus_workflows.airtable.deadline import DeadlineAdapter
from nexus_workflows.airtable.exceptions import AirtableNotConfigured
from nexus_workflows.conf import app_settings

API_KEY_SETTING = "AIRTABLE_API_KEY"
DEFAULT_ENDPOINT_URL = "https://api.airtable.com"

# requests sessions are not documented as thread-safe, and the runner calls the helpers
# from several worker threads: each thread keeps its own client.
_local = threading.local()


def api_key() -> str:
    """The Django setting ``AIRTABLE_API_KEY``, else the environment variable."""
    key = getattr(settings, API_KEY_SETTING, None) or os.environ.get(API_KEY_SETTING, "")
    if not isinstance(key, str) or not key.strip():
        raise AirtableNotConfigured(
            f"No Airtable API key: set {API_KEY_SETTING} in the environment (or in the Django "
            "settings) to a personal access token."
        )
    return key.strip()


def timeout_seconds() -> tuple[float, float, float]:
    """``AIRTABLE_TIMEOUT`` as ``(connect, read, total)`` seconds: one number ``T`` is
    ``(T, T, T)``; a pair ``(connect, read)`` is ``(connect, read, connect + read)``.
    ``total`` bounds the whole request; connect and read each wait on the socket."""
    value = app_settings.AIRTABLE_TIMEOUT
    if isinstance(value, list | tuple):
        connect, read = value
        return (connect, read, connect + read)
    return (value, value, value)


def timeout() -> Timeout:
    """``AIRTABLE_TIMEOUT`` as the urllib3 ``Timeout`` each request of the helpers' client
    is sent with: its ``total`` is held for the whole request by :class:`DeadlineAdapter`."""
    connect, read, total = timeout_seconds()
    return Timeout(connect=connect, read=read, total=total)


class UnexpectedAnswer(ValueError):
    """A success that is not of the shape of Airtable's answer to its request. The
    message never quotes the answer."""


def _after_v0(url: str) -> list[str]:
    parts = [part for part in urlsplit(url).path.split("/") if part]
    return parts[parts.index("v0") + 1 :] if "v0" in parts else []


def base_of(url: str) -> str | None:
    """The base id of an Airtable API URL (``…/v0/<base id>/…``), or None."""
    rest = _after_v0(url)
    if rest and rest[0].startswith("app"):
        return rest[0]
    return None


def _check_listing(method: str, url: str, answer: Any) -> None:
    """A page of a record listing always has ``records``. pyairtable reads a page
    without it as no records, so a proxy's ``{}`` would look like "nothing matches"
    (and a look-up before a create would create the record again)."""
    rest = _after_v0(url)
    listing = (method.upper() == "GET" and len(rest) == 2) or (
        method.upper() == "POST" and len(rest) == 3 and rest[2] == "listRecords"
    )
    if listing and isinstance(answer, dict) and "records" not in answer:
        raise UnexpectedAnswer("a page of a record listing without records")


class RateLimitedApi(Api):
    """pyairtable's ``Api`` that takes a start of ``airtable:<base id>`` (the setting
    ``AIRTABLE_RATE_LIMIT``, across every process of the database) before every request,
    pages of a listing and chunks of a batch included."""

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "requesting", False):
            # pyairtable sends a GET whose URL is too long as a POST by calling request()
            # again: that one HTTP request was counted (and its answer is checked) above.
            return super().request(method, url, *args, **kwargs)
        _local.requesting = True
        try:
            answer = self._metered(method, url, *args, **kwargs)
        finally:
            _local.requesting = False
        _local.answers = answers_received() + 1
        _check_listing(method, url, answer)
        return answer

    def _metered(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        limit = app_settings.AIRTABLE_RATE_LIMIT
        base = base_of(url)
        if limit is None or base is None:
            return super().request(method, url, *args, **kwargs)
        from nexus_workflows.flow import rate_limited

        with rate_limited(f"airtable:{base}", limit[0], limit[1], app_settings.AIRTABLE_RATE_LIMIT_TIMEOUT):
            return super().request(method, url, *args, **kwargs)


def answers_received() -> int:
    """How many successful answers this thread's client has read so far: the retry policy
    compares it before and after a call to tell a failure to parse an answer from the
    caller's own error."""
    return getattr(_local, "answers", 0)


def get_api() -> Api:
    """This thread's pyairtable ``Api`` for the current settings."""
    config = (api_key(), app_settings.AIRTABLE_ENDPOINT_URL or DEFAULT_ENDPOINT_URL, timeout_seconds())
    cached = getattr(_local, "client", None)
    if cached is not None and cached[0] == config:
        return cached[1]
    key, endpoint_url, _ = config
    api = RateLimitedApi(key, endpoint_url=endpoint_url, timeout=timeout(), retry_strategy=None)  # type: ignore[arg-type]
    # A redirect raises requests' TooManyRedirects before it is followed (see above).
    api.session.max_redirects = 0
    for prefix in ("https://", "http://"):
        api.session.mount(prefix, DeadlineAdapter())
    if cached is not None:
        cached[1].session.close()
    _local.client = (config, api)
    return api


def get_table(base_id: str, table: str) -> Table:
    """A pyairtable ``Table`` of this thread's client: every request takes a start of
    its base's window and ends within ``AIRTABLE_TIMEOUT`` as a whole, pyairtable's own
    retries are off and redirects are not followed. Wrap its calls in
    :func:`~nexus_workflows.airtable.retry.with_airtable_retry`."""
    return get_api().table(base_id, table)

"""System checks for the Airtable settings (ids nexus_workflows.E200-E219)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from django.core.checks import CheckMessage, Error, Tags, register

from nexus_workflows.airtable.client import API_KEY_SETTING
from nexus_workflows.checks import is_whole, seconds_rule, setting_error, whole_rule
from nexus_workflows.conf import SETTINGS_NAME, app_settings
from nexus_workflows.limits import RATE_LIMIT_MAX, RATE_PERIOD_MAX
from nexus_workflows.numbers import MAX_SECONDS, is_number, is_seconds

# AIRTABLE_TIMEOUT bounds a whole request (airtable/deadline.py), not each wait.
_TIMEOUT_SHAPE = (
    "one number (for the whole request), or (connect, read) (connecting within connect, "
    "the whole request within connect + read)"
)

# Upper bounds of the Airtable settings (README's Airtable settings table); larger values
# failed at run time with OverflowError.
AIRTABLE_MAX_ATTEMPTS = 100
# Each part of AIRTABLE_TIMEOUT: a socket waits in poll() for at most connect or read,
# and poll() takes whole milliseconds as a C int (at most 24.8 days); a request silent
# for a day is hung anyway.
AIRTABLE_MAX_TIMEOUT = 86_400
# The base's rate window is a rate_limited() window: its bounds (flow.windows).
_A_YEAR = RATE_PERIOD_MAX.total_seconds()

# What each setting allows, whole: the same words whichever side of it a value falls on
# (NaN, infinity and a string too), so that an error always names the upper bound.
_ATTEMPTS_RULE = whole_rule(1, AIRTABLE_MAX_ATTEMPTS)
_DELAY_RULE = seconds_rule(zero_allowed=True)
_DEADLINE_RULE = seconds_rule()
_TIMEOUT_RULE = f"seconds greater than 0 and at most {AIRTABLE_MAX_TIMEOUT:,} (a day): {_TIMEOUT_SHAPE}"
_RATE_LIMIT_RULE = (
    f"None, or (limit, period seconds): a whole number of requests of at least 1 and at "
    f"most {RATE_LIMIT_MAX:,}, and a number of seconds greater than 0 and at most "
    f"{_A_YEAR:,.0f} (a year)"
)
_RATE_LIMIT_TIMEOUT_RULE = f"a number of seconds 0 or more and at most {_A_YEAR:,.0f} (a year)"


def _is_endpoint_url(url: object) -> bool:
    """An http(s) URL with a host, a valid port if any, and no query; urllib's own errors
    for a malformed one (an unclosed "[", a port beyond 65535) count as no."""
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port out of range or not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not parts.query and port != 0


@register(Tags.compatibility)
def check_airtable_settings(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    # Long function: a flat list of independent setting checks.
    from django.conf import settings

    if not isinstance(getattr(settings, SETTINGS_NAME, {}), dict):
        return []  # reported as nexus_workflows.E001
    messages: list[CheckMessage] = []

    url = app_settings.AIRTABLE_ENDPOINT_URL
    if url is not None and not _is_endpoint_url(url):
        messages.append(
            setting_error(
                "AIRTABLE_ENDPOINT_URL",
                "None or an http(s) URL with a host, a port from 1 to 65535 if any, and no query, "
                "such as 'https://api.airtable.com'",
                url,
                "nexus_workflows.E200",
            )
        )

    attempts = app_settings.AIRTABLE_MAX_ATTEMPTS
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        messages.append(
            setting_error("AIRTABLE_MAX_ATTEMPTS", _ATTEMPTS_RULE, attempts, "nexus_workflows.E201")
        )

    for name in ("AIRTABLE_RATE_LIMIT_DELAY", "AIRTABLE_RETRY_BASE_DELAY", "AIRTABLE_MAX_RETRY_AFTER"):
        value = getattr(app_settings, name)
        if not is_number(value) or value < 0:
            messages.append(setting_error(name, _DELAY_RULE, value, "nexus_workflows.E202"))

    deadline = app_settings.AIRTABLE_RETRY_DEADLINE
    if not is_number(deadline) or deadline <= 0:
        messages.append(
            setting_error("AIRTABLE_RETRY_DEADLINE", _DEADLINE_RULE, deadline, "nexus_workflows.E208")
        )

    timeout = app_settings.AIRTABLE_TIMEOUT
    parts_ok = (
        all(is_number(part) and part > 0 for part in timeout)
        if isinstance(timeout, list | tuple) and len(timeout) == 2
        else is_number(timeout) and timeout > 0
    )
    if not parts_ok:
        messages.append(setting_error("AIRTABLE_TIMEOUT", _TIMEOUT_RULE, timeout, "nexus_workflows.E203"))

    rate_limit = app_settings.AIRTABLE_RATE_LIMIT
    if rate_limit is not None and not (
        isinstance(rate_limit, list | tuple)
        and len(rate_limit) == 2
        and isinstance(rate_limit[0], int)
        and not isinstance(rate_limit[0], bool)
        and rate_limit[0] >= 1
        and is_number(rate_limit[1])
        and rate_limit[1] > 0
    ):
        messages.append(
            setting_error("AIRTABLE_RATE_LIMIT", _RATE_LIMIT_RULE, rate_limit, "nexus_workflows.E205")
        )
    wait = app_settings.AIRTABLE_RATE_LIMIT_TIMEOUT
    if not is_number(wait) or wait < 0:
        messages.append(
            setting_error(
                "AIRTABLE_RATE_LIMIT_TIMEOUT", _RATE_LIMIT_TIMEOUT_RULE, wait, "nexus_workflows.E206"
            )
        )

    key = getattr(settings, API_KEY_SETTING, None)
    if key is not None and not isinstance(key, str):
        messages.append(
            Error(
                f"{API_KEY_SETTING} must be a string (an Airtable personal access token); "
                f"got {type(key).__name__}.",
                hint="Set it in the environment; project settings read it with django-environ.",
                id="nexus_workflows.E204",
            )
        )
    return messages


# The upper bounds are checked only for values the rules above accept, so that no value
# gets two errors.
_AIRTABLE_SECONDS = {
    "AIRTABLE_RATE_LIMIT_DELAY": "nexus_workflows.E202",
    "AIRTABLE_RETRY_BASE_DELAY": "nexus_workflows.E202",
    "AIRTABLE_MAX_RETRY_AFTER": "nexus_workflows.E202",
}


@register(Tags.compatibility)
def check_airtable_bounds(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    from django.conf import settings

    if not isinstance(getattr(settings, SETTINGS_NAME, {}), dict):
        return []  # reported as nexus_workflows.E001
    messages: list[CheckMessage] = []
    attempts = app_settings.AIRTABLE_MAX_ATTEMPTS
    if is_whole(attempts, AIRTABLE_MAX_ATTEMPTS + 1, math.inf):
        messages.append(
            setting_error("AIRTABLE_MAX_ATTEMPTS", _ATTEMPTS_RULE, attempts, "nexus_workflows.E201")
        )
    for name, check_id in _AIRTABLE_SECONDS.items():
        value = getattr(app_settings, name)
        if is_number(value) and value > MAX_SECONDS:
            messages.append(setting_error(name, _DELAY_RULE, value, check_id))
    deadline = app_settings.AIRTABLE_RETRY_DEADLINE
    if is_number(deadline) and deadline > MAX_SECONDS:
        messages.append(
            setting_error("AIRTABLE_RETRY_DEADLINE", _DEADLINE_RULE, deadline, "nexus_workflows.E208")
        )
    timeout = app_settings.AIRTABLE_TIMEOUT
    parts = timeout if isinstance(timeout, list | tuple) and len(timeout) == 2 else [timeout]
    if all(is_number(part) and part > 0 for part in parts) and max(parts) > AIRTABLE_MAX_TIMEOUT:
        messages.append(setting_error("AIRTABLE_TIMEOUT", _TIMEOUT_RULE, timeout, "nexus_workflows.E203"))
    wait = app_settings.AIRTABLE_RATE_LIMIT_TIMEOUT
    if is_number(wait) and wait > _A_YEAR:
        messages.append(
            setting_error(
                "AIRTABLE_RATE_LIMIT_TIMEOUT", _RATE_LIMIT_TIMEOUT_RULE, wait, "nexus_workflows.E206"
            )
        )
    rate_limit = app_settings.AIRTABLE_RATE_LIMIT
    if isinstance(rate_limit, list | tuple) and len(rate_limit) == 2:
        limit, period = rate_limit
        if (is_whole(limit, 1, math.inf) and is_number(period) and period > 0) and not (
            limit <= RATE_LIMIT_MAX and period <= _A_YEAR
        ):
            # A window is a ring of `limit` rows, made in one statement and read at every try.
            messages.append(
                setting_error("AIRTABLE_RATE_LIMIT", _RATE_LIMIT_RULE, rate_limit, "nexus_workflows.E205")
            )
    return messages + _check_airtable_backoff(attempts)


def _check_airtable_backoff(attempts: Any) -> list[CheckMessage]:
    """The back-off doubles per retry: ``base * 2 ** (attempts - 2)`` before the last one."""
    base = app_settings.AIRTABLE_RETRY_BASE_DELAY
    if not is_whole(attempts, 2, AIRTABLE_MAX_ATTEMPTS) or not is_seconds(base, zero_allowed=True):
        return []  # a single attempt never waits; bad values are reported on their own
    if base * 2 ** (attempts - 2) <= MAX_SECONDS:
        return []
    return [
        Error(
            f"{SETTINGS_NAME}['AIRTABLE_RETRY_BASE_DELAY'] doubles at each retry: the wait before "
            "the last attempt, AIRTABLE_RETRY_BASE_DELAY x 2 ** (AIRTABLE_MAX_ATTEMPTS - 2), must be "
            f"at most {MAX_SECONDS:,.0f} seconds (ten years).",
            hint="Lower AIRTABLE_MAX_ATTEMPTS or AIRTABLE_RETRY_BASE_DELAY; leave long waits "
            "to the workflow's retry schedule.",
            id="nexus_workflows.E207",
        )
    ]

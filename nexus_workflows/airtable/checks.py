"""System checks for the Airtable settings (ids nexus_workflows.E200-E219)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from django.core.checks import CheckMessage, Error, Tags, register

from nexus_workflows.airtable.client import API_KEY_SETTING
from nexus_workflows.checks import is_number, setting_error
from nexus_workflows.conf import SETTINGS_NAME, app_settings


@register(Tags.compatibility)
def check_airtable_settings(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    # Long function: a flat list of independent setting checks.
    from django.conf import settings

    if not isinstance(getattr(settings, SETTINGS_NAME, {}), dict):
        return []  # reported as nexus_workflows.E001
    messages: list[CheckMessage] = []

    url = app_settings.AIRTABLE_ENDPOINT_URL
    if url is not None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
            messages.append(
                setting_error(
                    "AIRTABLE_ENDPOINT_URL",
                    "None or an http(s) URL without query, such as 'https://api.airtable.com'",
                    url,
                    "nexus_workflows.E200",
                )
            )

    attempts = app_settings.AIRTABLE_MAX_ATTEMPTS
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        messages.append(
            setting_error(
                "AIRTABLE_MAX_ATTEMPTS", "a whole number of at least 1", attempts, "nexus_workflows.E201"
            )
        )

    for name in ("AIRTABLE_RATE_LIMIT_DELAY", "AIRTABLE_RETRY_BASE_DELAY", "AIRTABLE_MAX_RETRY_AFTER"):
        value = getattr(app_settings, name)
        if not is_number(value) or value < 0:
            messages.append(
                setting_error(name, "a number of seconds, 0 or more", value, "nexus_workflows.E202")
            )

    timeout = app_settings.AIRTABLE_TIMEOUT
    parts_ok = (
        all(is_number(part) and part > 0 for part in timeout)
        if isinstance(timeout, list | tuple) and len(timeout) == 2
        else is_number(timeout) and timeout > 0
    )
    if not parts_ok:
        messages.append(
            setting_error(
                "AIRTABLE_TIMEOUT",
                "seconds greater than 0: one number, or (connect, read)",
                timeout,
                "nexus_workflows.E203",
            )
        )

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
            setting_error(
                "AIRTABLE_RATE_LIMIT",
                "None, or (limit, period seconds): a whole number of requests of at least 1 "
                "and a number of seconds greater than 0",
                rate_limit,
                "nexus_workflows.E205",
            )
        )
    wait = app_settings.AIRTABLE_RATE_LIMIT_TIMEOUT
    if not is_number(wait) or wait < 0:
        messages.append(
            setting_error(
                "AIRTABLE_RATE_LIMIT_TIMEOUT", "a number of seconds, 0 or more", wait, "nexus_workflows.E206"
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

"""System checks of the PHI token map settings (ids nexus_workflows.E100 to E119, W100 to W119).

The key checks are the same rules that make the first encode raise
``PhiConfigurationError``, so ``manage.py check`` (and every management command) reports
a deployment without keys before it handles any patient data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import phonenumbers
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from nexus_workflows.conf import DEFAULTS, SETTINGS_NAME, app_settings
from nexus_workflows.phi.keys import key_problems


def _settings_are_a_dict() -> bool:
    # Otherwise nexus_workflows.E001 already says so; every PHI message would repeat it.
    from django.conf import settings

    return isinstance(getattr(settings, SETTINGS_NAME, {}), dict)


@register(Tags.security)
def check_phi_keys(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    if not _settings_are_a_dict():
        return []
    messages: list[CheckMessage] = []
    for problem in key_problems():
        level = Error if problem.is_error else Warning
        messages.append(level(problem.message, hint=problem.hint, id=problem.check_id))
    return messages


@register(Tags.compatibility)
def check_phi_settings(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    if not _settings_are_a_dict():
        return []
    messages: list[CheckMessage] = []
    region = app_settings.PHI_DEFAULT_REGION
    if not isinstance(region, str) or region not in phonenumbers.SUPPORTED_REGIONS:
        messages.append(
            Error(
                f"{SETTINGS_NAME}['PHI_DEFAULT_REGION'] must be a region code phonenumbers knows "
                f"(ISO 3166-1 alpha-2, upper case); got {region!r}.",
                hint=f"The default is {DEFAULTS['PHI_DEFAULT_REGION']!r}.",
                id="nexus_workflows.E106",
            )
        )
    ttl = app_settings.PHI_CACHE_TTL
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0:
        messages.append(
            Error(
                f"{SETTINGS_NAME}['PHI_CACHE_TTL'] must be a number of seconds greater than 0; got {ttl!r}.",
                hint=f"The default is {DEFAULTS['PHI_CACHE_TTL']!r}.",
                id="nexus_workflows.E107",
            )
        )
    size = app_settings.PHI_CACHE_SIZE
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        messages.append(
            Error(
                f"{SETTINGS_NAME}['PHI_CACHE_SIZE'] must be a whole number of at least 1; got {size!r}.",
                hint=f"The default is {DEFAULTS['PHI_CACHE_SIZE']!r} (token maps kept per process).",
                id="nexus_workflows.E108",
            )
        )
    return messages

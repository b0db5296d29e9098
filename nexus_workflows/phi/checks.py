"""System checks of the PHI token map settings (ids nexus_workflows.E100 to E119, W100 to W119).

The key checks are the same rules that make the first encode raise
``PhiConfigurationError``, so ``manage.py check`` (and every management command) reports
a deployment without keys before it handles any patient data.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import phonenumbers
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from nexus_workflows.checks import is_whole, seconds_rule, setting_error, whole_rule
from nexus_workflows.conf import SETTINGS_NAME, app_settings
from nexus_workflows.numbers import is_seconds
from nexus_workflows.phi.keys import key_problems

#: Most token maps one process keeps in memory.
PHI_CACHE_SIZE_MAX = 1_000_000


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
    # Named by type, never by value (nexus_workflows.checks.setting_error).
    region = app_settings.PHI_DEFAULT_REGION
    if not isinstance(region, str) or region not in phonenumbers.SUPPORTED_REGIONS:
        rule = "a region code phonenumbers knows (ISO 3166-1 alpha-2, upper case)"
        messages.append(setting_error("PHI_DEFAULT_REGION", rule, region, "nexus_workflows.E106"))
    ttl = app_settings.PHI_CACHE_TTL
    if not is_seconds(ttl):
        messages.append(setting_error("PHI_CACHE_TTL", seconds_rule(), ttl, "nexus_workflows.E107"))
    size = app_settings.PHI_CACHE_SIZE
    if not is_whole(size, 1, PHI_CACHE_SIZE_MAX):
        rule = f"{whole_rule(1, PHI_CACHE_SIZE_MAX)} (token maps kept per process)"
        messages.append(setting_error("PHI_CACHE_SIZE", rule, size, "nexus_workflows.E108"))
    if not isinstance(app_settings.PHI_PADDING, bool):
        rule = "True or False (pad plaintexts before encryption)"
        messages.append(setting_error("PHI_PADDING", rule, app_settings.PHI_PADDING, "nexus_workflows.E109"))
    return messages

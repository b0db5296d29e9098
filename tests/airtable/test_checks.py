"""System checks of the Airtable settings."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_workflows.airtable.checks import check_airtable_settings


def ids(settings: Any, **overrides: Any) -> list[str]:
    settings.NEXUS_WORKFLOWS = overrides
    return [message.id for message in check_airtable_settings()]


def test_the_defaults_pass(settings: Any) -> None:
    assert ids(settings) == []


def test_good_values_pass(settings: Any) -> None:
    assert (
        ids(
            settings,
            AIRTABLE_ENDPOINT_URL="http://127.0.0.1:8080",
            AIRTABLE_MAX_ATTEMPTS=1,
            AIRTABLE_RATE_LIMIT_DELAY=0,
            AIRTABLE_RETRY_BASE_DELAY=0.5,
            AIRTABLE_MAX_RETRY_AFTER=120,
            AIRTABLE_TIMEOUT=10,
            AIRTABLE_RATE_LIMIT=None,
            AIRTABLE_RATE_LIMIT_TIMEOUT=0,
        )
        == []
    )


@pytest.mark.parametrize(
    ("name", "value", "check_id"),
    [
        ("AIRTABLE_ENDPOINT_URL", "api.airtable.com", "nexus_workflows.E200"),
        ("AIRTABLE_ENDPOINT_URL", "ftp://api.airtable.com", "nexus_workflows.E200"),
        ("AIRTABLE_ENDPOINT_URL", "https://api.airtable.com?x=1", "nexus_workflows.E200"),
        ("AIRTABLE_ENDPOINT_URL", 8080, "nexus_workflows.E200"),
        ("AIRTABLE_MAX_ATTEMPTS", 0, "nexus_workflows.E201"),
        ("AIRTABLE_MAX_ATTEMPTS", 2.5, "nexus_workflows.E201"),
        ("AIRTABLE_MAX_ATTEMPTS", True, "nexus_workflows.E201"),
        ("AIRTABLE_RATE_LIMIT_DELAY", -1, "nexus_workflows.E202"),
        ("AIRTABLE_RETRY_BASE_DELAY", "1", "nexus_workflows.E202"),
        ("AIRTABLE_MAX_RETRY_AFTER", float("inf"), "nexus_workflows.E202"),
        ("AIRTABLE_TIMEOUT", None, "nexus_workflows.E203"),
        ("AIRTABLE_TIMEOUT", 0, "nexus_workflows.E203"),
        ("AIRTABLE_TIMEOUT", (5,), "nexus_workflows.E203"),
        ("AIRTABLE_TIMEOUT", (5, -1), "nexus_workflows.E203"),
        ("AIRTABLE_RATE_LIMIT", 5, "nexus_workflows.E205"),
        ("AIRTABLE_RATE_LIMIT", (0, 1), "nexus_workflows.E205"),
        ("AIRTABLE_RATE_LIMIT", (5, 0), "nexus_workflows.E205"),
        ("AIRTABLE_RATE_LIMIT", (True, 1), "nexus_workflows.E205"),
        ("AIRTABLE_RATE_LIMIT", (5.5, 1), "nexus_workflows.E205"),
        ("AIRTABLE_RATE_LIMIT", (5, 1, 1), "nexus_workflows.E205"),
        ("AIRTABLE_RATE_LIMIT_TIMEOUT", -1, "nexus_workflows.E206"),
        ("AIRTABLE_RATE_LIMIT_TIMEOUT", None, "nexus_workflows.E206"),
    ],
)
def test_bad_values_are_errors(settings: Any, name: str, value: Any, check_id: str) -> None:
    assert ids(settings, **{name: value}) == [check_id]


def test_an_api_key_that_is_not_a_string_is_an_error(settings: Any) -> None:
    settings.AIRTABLE_API_KEY = 1234
    assert ids(settings) == ["nexus_workflows.E204"]


# Every check runs here, and on Django 6.1 JSONField's check asks SQLite whether it
# supports JSON: a query.
@pytest.mark.django_db
def test_the_check_is_registered(settings: Any) -> None:
    from django.core import checks

    settings.NEXUS_WORKFLOWS = {"AIRTABLE_MAX_ATTEMPTS": 0}
    assert "nexus_workflows.E201" in [m.id for m in checks.run_checks()]

"""System checks of the Airtable settings."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from nexus_workflows.airtable.checks import check_airtable_settings
from nexus_workflows.numbers import MAX_SECONDS


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
            AIRTABLE_RETRY_DEADLINE=0.5,
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
        # urllib's own ValueError (echoing the URL, a password in it too) crashed the check.
        ("AIRTABLE_ENDPOINT_URL", "https://[api.airtable.com", "nexus_workflows.E200"),
        ("AIRTABLE_ENDPOINT_URL", "https://user:s3cret@api.airtable.com:99999", "nexus_workflows.E200"),
        ("AIRTABLE_ENDPOINT_URL", "https://api.airtable.com:0", "nexus_workflows.E200"),
        ("AIRTABLE_ENDPOINT_URL", "https://\uff41\uff50\uff49.airtable.com\uff03x@y", "nexus_workflows.E200"),
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
        ("AIRTABLE_RETRY_DEADLINE", 0, "nexus_workflows.E208"),
        ("AIRTABLE_RETRY_DEADLINE", -1, "nexus_workflows.E208"),
        ("AIRTABLE_RETRY_DEADLINE", None, "nexus_workflows.E208"),
        ("AIRTABLE_RETRY_DEADLINE", "120", "nexus_workflows.E208"),
        ("AIRTABLE_RETRY_DEADLINE", float("nan"), "nexus_workflows.E208"),
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


def message_ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def airtable_checks(settings: dict[str, Any]) -> list[Any]:
    from nexus_workflows.airtable.checks import check_airtable_bounds

    with override_settings(NEXUS_WORKFLOWS=settings):
        return [*check_airtable_settings(), *check_airtable_bounds()]


def test_airtable_values_up_to_their_bounds_pass() -> None:
    largest = {
        "AIRTABLE_MAX_ATTEMPTS": 100,
        "AIRTABLE_RETRY_BASE_DELAY": MAX_SECONDS / 2**98,  # its last back-off: MAX_SECONDS
        "AIRTABLE_RATE_LIMIT_DELAY": MAX_SECONDS,
        "AIRTABLE_MAX_RETRY_AFTER": MAX_SECONDS,
        "AIRTABLE_TIMEOUT": (86_400, 86_400),
        "AIRTABLE_RATE_LIMIT": (10_000, 366 * 86_400),  # a rate_limited() window's bounds
        "AIRTABLE_RATE_LIMIT_TIMEOUT": 366 * 86_400,
        "AIRTABLE_RETRY_DEADLINE": MAX_SECONDS,
    }
    assert airtable_checks(largest) == []
    assert airtable_checks({"AIRTABLE_MAX_ATTEMPTS": 30}) == []  # 2**28 s with the default 1 s


# Each too-large value raised OverflowError at run time (time.sleep, a socket's timeout,
# a rate window's timedelta) though the checks accepted it.
@pytest.mark.parametrize(
    ("settings", "check_id", "rule"),
    [
        ({"AIRTABLE_MAX_ATTEMPTS": 101}, "E201", "a whole number of at least 1 and at most 100"),
        ({"AIRTABLE_MAX_ATTEMPTS": 10**20}, "E201", "at most 100"),
        ({"AIRTABLE_RETRY_BASE_DELAY": 1e300}, "E202", "seconds 0 or more and at most 315,619,200"),
        ({"AIRTABLE_RATE_LIMIT_DELAY": 1e15}, "E202", "seconds 0 or more and at most 315,619,200"),
        ({"AIRTABLE_MAX_RETRY_AFTER": 1e300}, "E202", "seconds 0 or more and at most 315,619,200"),
        ({"AIRTABLE_TIMEOUT": 1e300}, "E203", "seconds greater than 0 and at most 86,400 (a day)"),
        ({"AIRTABLE_TIMEOUT": [5, 86_401]}, "E203", "at most 86,400 (a day)"),
        ({"AIRTABLE_RATE_LIMIT": (5, 1e15)}, "E205", "greater than 0 and at most 31,622,400 (a year)"),
        ({"AIRTABLE_RATE_LIMIT": (5, 366 * 86_400 + 1)}, "E205", "at most 31,622,400 (a year)"),
        ({"AIRTABLE_RATE_LIMIT": (10_001, 1)}, "E205", "requests of at least 1 and at most 10,000"),
        ({"AIRTABLE_RATE_LIMIT_TIMEOUT": 1e300}, "E206", "seconds 0 or more and at most 31,622,400 (a year)"),
        ({"AIRTABLE_RETRY_DEADLINE": 1e300}, "E208", "seconds greater than 0 and at most 315,619,200"),
        ({"AIRTABLE_MAX_ATTEMPTS": 31}, "E207", "BASE_DELAY x 2 ** (AIRTABLE_MAX_ATTEMPTS - 2), must be"),
        ({"AIRTABLE_MAX_ATTEMPTS": 3, "AIRTABLE_RETRY_BASE_DELAY": MAX_SECONDS}, "E207", "ten years"),
    ],
)
def test_airtable_values_beyond_their_bounds_are_errors(
    settings: dict[str, Any], check_id: str, rule: str
) -> None:
    messages = airtable_checks(settings)
    assert message_ids(messages) == [f"nexus_workflows.{check_id}"]
    assert rule in messages[0].msg


@pytest.mark.parametrize(
    ("settings", "check_id"),
    [
        ({"AIRTABLE_MAX_ATTEMPTS": 0}, "E201"),
        ({"AIRTABLE_MAX_ATTEMPTS": 1e300}, "E201"),
        ({"AIRTABLE_RETRY_BASE_DELAY": float("inf")}, "E202"),
        ({"AIRTABLE_TIMEOUT": (5, 1e300, 1)}, "E203"),
        ({"AIRTABLE_RATE_LIMIT": (1e300, 1)}, "E205"),
        ({"AIRTABLE_RATE_LIMIT": (5, -1e300)}, "E205"),
        ({"AIRTABLE_RATE_LIMIT_TIMEOUT": "1e300"}, "E206"),
        ({"AIRTABLE_RETRY_DEADLINE": float("inf")}, "E208"),
    ],
)
def test_an_airtable_value_breaking_another_rule_gets_that_error_only(
    settings: dict[str, Any], check_id: str
) -> None:
    assert message_ids(airtable_checks(settings)) == [f"nexus_workflows.{check_id}"]


# Every check runs here, and on Django 6.1 JSONField's check asks SQLite whether it
# supports JSON: a query.
@pytest.mark.django_db
def test_the_airtable_bounds_are_a_registered_check() -> None:
    from django.core import checks

    with override_settings(NEXUS_WORKFLOWS={"AIRTABLE_TIMEOUT": 1e300}):
        assert "nexus_workflows.E203" in message_ids(checks.run_checks())


# Whichever rule a value breaks (too small, not a number, infinite), the message says the
# whole rule, upper bound included: an operator who gave infinity or -1 learns the range.
@pytest.mark.parametrize(
    ("settings", "check_id", "rule"),
    [
        ({"AIRTABLE_MAX_ATTEMPTS": -7}, "E201", "a whole number of at least 1 and at most 100"),
        ({"AIRTABLE_MAX_ATTEMPTS": 1e300}, "E201", "a whole number of at least 1 and at most 100"),
        ({"AIRTABLE_RETRY_BASE_DELAY": float("inf")}, "E202", "seconds 0 or more and at most 315,619,200"),
        ({"AIRTABLE_RATE_LIMIT_DELAY": -7}, "E202", "seconds 0 or more and at most 315,619,200"),
        ({"AIRTABLE_MAX_RETRY_AFTER": "7"}, "E202", "seconds 0 or more and at most 315,619,200"),
        ({"AIRTABLE_TIMEOUT": (5, -7)}, "E203", "seconds greater than 0 and at most 86,400 (a day)"),
        ({"AIRTABLE_RATE_LIMIT": (0, 7)}, "E205", "at least 1 and at most 10,000"),
        ({"AIRTABLE_RATE_LIMIT": (5, -7)}, "E205", "greater than 0 and at most 31,622,400 (a year)"),
        ({"AIRTABLE_RATE_LIMIT_TIMEOUT": -7}, "E206", "seconds 0 or more and at most 31,622,400 (a year)"),
        ({"AIRTABLE_RETRY_DEADLINE": float("inf")}, "E208", "seconds greater than 0 and at most 315,619,200"),
        ({"AIRTABLE_RETRY_DEADLINE": -7}, "E208", "seconds greater than 0 and at most 315,619,200"),
        ({"AIRTABLE_RETRY_DEADLINE": "7"}, "E208", "seconds greater than 0 and at most 315,619,200"),
    ],
)
def test_airtable_errors_name_the_upper_bound_whatever_rule_was_broken(
    settings: dict[str, Any], check_id: str, rule: str
) -> None:
    messages = airtable_checks(settings)
    assert message_ids(messages) == [f"nexus_workflows.{check_id}"]
    assert rule in messages[0].msg
    for echoed in ("-7", "'7'", "inf", "1e+300"):  # never the value
        assert echoed not in messages[0].msg


def test_an_endpoint_url_is_never_quoted(settings: Any) -> None:
    from nexus_workflows.airtable.checks import check_airtable_settings

    settings.NEXUS_WORKFLOWS = {
        **settings.NEXUS_WORKFLOWS,
        "AIRTABLE_ENDPOINT_URL": "https://user:s3cret@api.airtable.com:99999",
    }
    (message,) = check_airtable_settings()
    assert "s3cret" not in message.msg
    assert "port from 1 to 65535" in message.msg

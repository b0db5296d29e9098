from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from nexus_workflows.checks import check_settings
from nexus_workflows.conf import DEFAULTS, app_settings


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_defaults_pass() -> None:
    with override_settings(NEXUS_WORKFLOWS={}):
        assert check_settings() == []


def test_defaults_are_documented_values() -> None:
    assert DEFAULTS["RETENTION"] == 86_400
    assert DEFAULTS["STALE_AFTER"] == 300
    with override_settings(NEXUS_WORKFLOWS={"STALE_AFTER": 60}):
        assert app_settings.STALE_AFTER == 60
        assert app_settings.RETENTION == 86_400


def test_settings_must_be_a_dict() -> None:
    with override_settings(NEXUS_WORKFLOWS=[("RETENTION", 1)]):
        assert ids(check_settings()) == ["nexus_workflows.E001"]


def test_unknown_settings_are_a_warning_naming_them() -> None:
    with override_settings(NEXUS_WORKFLOWS={"RETENTON": 5}):
        (message,) = check_settings()
    assert message.id == "nexus_workflows.W001"
    assert "RETENTON" in message.msg
    assert "RETENTION" in message.hint


@pytest.mark.parametrize(
    ("settings", "check_id", "text"),
    [
        ({"RETENTION": 0}, "nexus_workflows.E002", "RETENTION'] must be a number of seconds greater than 0"),
        ({"STALE_AFTER": "300"}, "nexus_workflows.E002", "STALE_AFTER"),
        ({"POLL_INTERVAL": float("nan")}, "nexus_workflows.E002", "POLL_INTERVAL"),
        (
            {"SHUTDOWN_GRACE": -1},
            "nexus_workflows.E002",
            "SHUTDOWN_GRACE'] must be a number of seconds 0 or more",
        ),
        ({"CONCURRENCY": 0}, "nexus_workflows.E003", "CONCURRENCY'] must be a whole number of at least 1"),
        ({"BATCH_SIZE": 2.5}, "nexus_workflows.E003", "BATCH_SIZE"),
        ({"WAKEUP": "yes"}, "nexus_workflows.E005", "WAKEUP'] must be True or False"),
        (
            {"STALE_AFTER": 60, "HEARTBEAT_INTERVAL": 31},
            "nexus_workflows.E004",
            "must be at most half of STALE_AFTER",
        ),
    ],
)
def test_invalid_values_are_errors(settings: dict[str, Any], check_id: str, text: str) -> None:
    with override_settings(NEXUS_WORKFLOWS=settings):
        messages = check_settings()
    assert ids(messages) == [check_id]
    assert text in messages[0].msg


def test_a_schedule_longer_than_the_retention_is_an_error(register_workflow: Any) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1, 120]).kind
    with override_settings(NEXUS_WORKFLOWS={"RETENTION": 3600}):
        messages = check_settings()
    assert ids(messages) == ["nexus_workflows.E007"]
    assert kind in messages[0].msg


# Every check runs here, and on Django 6.1 JSONField's check asks SQLite whether it
# supports JSON: a query.
@pytest.mark.django_db
def test_commands_refuse_to_start_on_invalid_settings() -> None:
    with (
        override_settings(NEXUS_WORKFLOWS={"CONCURRENCY": -2}),
        pytest.raises(SystemCheckError, match="E003"),
    ):
        call_command("runworkflows", "--once", skip_checks=False)

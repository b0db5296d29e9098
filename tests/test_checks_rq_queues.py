"""System checks for the django-rq side of fire-and-forget workflows (E300 to E304)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from nexus_workflows.checks import check_rq_queues
from nexus_workflows.fire_and_forget.embedded import embedded_queue


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_the_test_settings_pass() -> None:
    assert check_rq_queues() == []


def test_the_embedded_queue_passes(settings: Any) -> None:
    settings.RQ_QUEUES = {"default": embedded_queue()}
    assert check_rq_queues() == []


def test_django_rq_must_be_installed() -> None:
    from django.conf import settings

    apps = [app for app in settings.INSTALLED_APPS if app != "django_rq"]
    with override_settings(INSTALLED_APPS=apps):
        messages = check_rq_queues()
    assert ids(messages) == ["nexus_workflows.E300"]
    assert "'django_rq' is not in INSTALLED_APPS" in messages[0].msg


@pytest.mark.parametrize("queues", [{}, None, ["default"]])
def test_rq_queues_must_be_a_non_empty_dict(settings: Any, queues: Any) -> None:
    settings.RQ_QUEUES = queues
    assert ids(check_rq_queues()) == ["nexus_workflows.E301"]


@pytest.mark.parametrize("name", [5, "", None])
def test_rq_queue_must_be_a_queue_name(settings: Any, name: Any) -> None:
    settings.NEXUS_WORKFLOWS = {"RQ_QUEUE": name}
    messages = check_rq_queues()
    assert ids(messages) == ["nexus_workflows.E302"]
    assert "NEXUS_WORKFLOWS['RQ_QUEUE'] must be the name of a queue in RQ_QUEUES" in messages[0].msg


def test_rq_queue_must_be_configured_in_rq_queues(settings: Any) -> None:
    settings.NEXUS_WORKFLOWS = {"RQ_QUEUE": "missing"}
    messages = check_rq_queues()
    assert ids(messages) == ["nexus_workflows.E303"]
    message = messages[0].msg
    assert "(a string of 7 character(s)) is not a queue in RQ_QUEUES (default, urgent)" in message
    assert "missing" not in message


def test_an_asynchronous_queue_on_fakeredis_is_an_error(settings: Any) -> None:
    config = embedded_queue()
    config["ASYNC"] = True
    settings.RQ_QUEUES = {"default": config}
    messages = check_rq_queues()
    assert ids(messages) == ["nexus_workflows.E304"]
    assert "its jobs would never run" in messages[0].hint


def test_queue_names_that_are_not_strings_are_no_crash(settings: Any) -> None:
    settings.RQ_QUEUES = {1: embedded_queue(), "default": embedded_queue()}
    assert check_rq_queues() == []
    settings.NEXUS_WORKFLOWS = {"RQ_QUEUE": "missing"}
    messages = check_rq_queues()
    assert ids(messages) == ["nexus_workflows.E303"]
    assert "not a queue in RQ_QUEUES (1, default)" in messages[0].msg

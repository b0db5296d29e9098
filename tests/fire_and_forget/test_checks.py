"""System checks for the django-rq side of fire-and-forget workflows (E300 to E304, W305)."""

from __future__ import annotations

import tomllib
from importlib import metadata
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from packaging.requirements import Requirement

from nexus_workflows.fire_and_forget.checks import (
    HANGING_REDIS_RELEASES,
    check_redis_release,
    check_rq_queues,
    redis_release_warnings,
)
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


def test_a_redis_release_whose_workers_hang_at_stop_is_a_warning() -> None:
    messages = redis_release_warnings("8.2.0")
    assert ids(messages) == ["nexus_workflows.W305"]
    assert "up to 60 s" in messages[0].msg
    assert "8.1.0" in messages[0].hint


@pytest.mark.parametrize("release", ["8.1.0", "8.0.1", "5.0.0", "8.2.1", "9.0.0"])
def test_other_redis_releases_pass(release: str) -> None:
    assert redis_release_warnings(release) == []


def test_the_installed_redis_is_checked_and_passes() -> None:
    installed = metadata.version("redis")
    assert installed not in HANGING_REDIS_RELEASES  # the pinned stack (requirements*.txt)
    assert check_redis_release() == redis_release_warnings(installed) == []


@pytest.mark.django_db  # Django 6.1's checks of MariaDB read its server
def test_the_check_runs_with_manage_py_check() -> None:
    # Warnings are printed, not raised (Django 6.1 on MariaDB warns of its own: W036 …).
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err)
    assert "nexus_workflows.W305" not in out.getvalue() + err.getvalue()


def test_the_package_declares_every_hanging_release_excluded() -> None:
    """pyproject's redis range keeps out every release the check warns of, and only those
    among the releases around them (a project resolving our ranges never meets W305)."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (spec,) = [Requirement(d) for d in pyproject["project"]["dependencies"] if Requirement(d).name == "redis"]
    for release in HANGING_REDIS_RELEASES:
        assert release not in spec.specifier, release
    assert all(release in spec.specifier for release in ("8.1.0", "8.2.1", "5.0.0"))

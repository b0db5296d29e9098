from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from nexus_workflows.checks import check_settings
from nexus_workflows.conf import DEFAULTS, app_settings
from nexus_workflows.numbers import MAX_SECONDS
from tests.processes import ManagePy


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_defaults_pass() -> None:
    with override_settings(NEXUS_WORKFLOWS={}):
        assert check_settings() == []


def documented_defaults() -> dict[str, Any]:
    """The defaults README.md gives: each row of its "| setting | default | meaning |"
    tables, and the PHI settings' defaults in its prose (`PHI_X`, default `v` / `PHI_X` … (n))."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    found: dict[str, Any] = {}
    for table in re.findall(r"^\| setting \| default \| meaning \|\n\|[-|]+\|\n((?:\|.*\n)+)", readme, re.M):
        for name, default in re.findall(r"^\| `([A-Z_]+)` \| `([^`]+)`", table, re.M):
            found[name] = ast.literal_eval(default)
    phi_prose = r"`(PHI_[A-Z_]+)`(?:, default `([^`]+)`| \w+ \((\d+)[,)])"
    for name, quoted, number in re.findall(phi_prose, readme):
        found.setdefault(name, ast.literal_eval(quoted or number))
    return found


def test_defaults_are_documented_values() -> None:
    documented = documented_defaults()
    secrets = {"PHI_HMAC_KEY", "PHI_ENCRYPTION_KEYS"}  # no default: taken from the environment
    assert set(DEFAULTS) - secrets - set(documented) == set()
    assert {name: DEFAULTS.get(name, "not a setting") for name in documented} == documented
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


def test_keys_that_are_not_strings_are_unknown_settings_counted_not_shown() -> None:
    """Not a TypeError from sorting str and int keys together, which would stop every
    management command; and such a key could be anything, so it is not echoed."""
    with override_settings(NEXUS_WORKFLOWS={1: 2, ("s3cr3t",): 3, "RETENTON": 5, "RETENTION": 60}):
        (message,) = check_settings()
    assert message.id == "nexus_workflows.W001"
    assert "unknown setting(s): RETENTON, 2 key(s) that are not strings." in message.msg
    assert "s3cr3t" not in message.msg + message.hint


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
        (
            {"ASYNC_CONCURRENCY": 0},
            "nexus_workflows.E003",
            "ASYNC_CONCURRENCY'] must be a whole number of at least 1",
        ),
        # Main loop, heartbeat, wake-up listener and at least one journal writer.
        (
            {"DB_CONNECTIONS": 3},
            "nexus_workflows.E003",
            "DB_CONNECTIONS'] must be a whole number of at least 4",
        ),
        (
            {"METRICS_MAX_CONNECTIONS": 0},
            "nexus_workflows.E003",
            "METRICS_MAX_CONNECTIONS'] must be a whole number of at least 1",
        ),
        ({"METRICS_MAX_CONNECTIONS": "16"}, "nexus_workflows.E003", "METRICS_MAX_CONNECTIONS"),
        ({"WAKEUP": "yes"}, "nexus_workflows.E005", "WAKEUP'] must be True or False"),
        (
            {"WAKEUP_FALLBACK_POLL_INTERVAL": 0},
            "nexus_workflows.E002",
            "WAKEUP_FALLBACK_POLL_INTERVAL'] must be a number of seconds greater than 0",
        ),
        (
            {"WAKEUP_DATABASE": "replica"},
            "nexus_workflows.E020",
            "must be an alias of DATABASES; got a string of 7 character(s). DATABASES has: 'default'",
        ),
        ({"WAKEUP_DATABASE": 1}, "nexus_workflows.E020", "must be a string or None; got a value of type int"),
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


# Each too-large value broke a runner at run time (OverflowError, "can't start new
# thread", a purge failing for good) though the checks accepted it.
@pytest.mark.parametrize(
    ("name", "largest", "too_large", "rule"),
    [
        ("RETENTION", MAX_SECONDS, 10**20, "seconds greater than 0 and at most 315,619,200 (ten years)"),
        ("RETENTION", MAX_SECONDS, 1e15, "at most 315,619,200"),
        ("STALE_AFTER", MAX_SECONDS, 1e15, "at most 315,619,200"),
        ("HEARTBEAT_INTERVAL", MAX_SECONDS / 2, MAX_SECONDS + 1, "at most 315,619,200"),
        ("POLL_INTERVAL", MAX_SECONDS, 1e300, "at most 315,619,200"),
        ("WAKEUP_FALLBACK_POLL_INTERVAL", MAX_SECONDS, 1e300, "at most 315,619,200"),
        ("SWEEP_INTERVAL", MAX_SECONDS, MAX_SECONDS + 0.5, "at most 315,619,200"),
        ("PURGE_BATCH_SECONDS", MAX_SECONDS, 1e300, "at most 315,619,200"),
        ("SHUTDOWN_GRACE", MAX_SECONDS, 1e300, "seconds 0 or more and at most 315,619,200 (ten years)"),
        ("CONCURRENCY", 1024, 10**9, "a whole number of at least 1 and at most 1,024"),
        ("DB_CONNECTIONS", 1024, 1025, "a whole number of at least 4 and at most 1,024"),
        ("METRICS_MAX_CONNECTIONS", 1024, 1025, "a whole number of at least 1 and at most 1,024"),
        ("ASYNC_CONCURRENCY", 10_000, 10_001, "a whole number of at least 1 and at most 10,000"),
        ("BATCH_SIZE", 10_000, 10**20, "a whole number of at least 1 and at most 10,000"),
        ("PURGE_BATCH_SIZE", 10_000, 10**20, "a whole number of at least 1 and at most 10,000"),
    ],
)
def test_values_up_to_their_bound_pass_and_larger_ones_are_errors(
    name: str, largest: float, too_large: float, rule: str
) -> None:
    roomy = {"STALE_AFTER": MAX_SECONDS, "HEARTBEAT_INTERVAL": 1}  # E004 stays out of the way
    with override_settings(NEXUS_WORKFLOWS={**roomy, name: largest}):
        assert check_settings() == []
    with override_settings(NEXUS_WORKFLOWS={**roomy, name: too_large}):
        messages = check_settings()
    assert ids(messages) == ["nexus_workflows.E002" if isinstance(largest, float) else "nexus_workflows.E003"]
    assert f"{name}'] must be " in messages[0].msg
    assert rule in messages[0].msg


SECRET = "https://user:s3cr3t@proxy.example/?api_key=patXYZ"
SECRET_PARTS = ("s3cr3t", "patXYZ", "proxy.example")
A_SECRET = f"a string of {len(SECRET)} character(s)"


@pytest.mark.parametrize(
    ("settings", "check", "got", "hidden"),
    [
        ({"AIRTABLE_ENDPOINT_URL": SECRET}, "airtable", A_SECRET, SECRET_PARTS),
        ({"RETENTION": SECRET}, "settings", A_SECRET, SECRET_PARTS),
        ({"CONCURRENCY": [SECRET]}, "settings", "a list of 1 item(s)", SECRET_PARTS),
        ({"WAKEUP": {"url": SECRET}}, "settings", "a dict of 1 item(s)", (*SECRET_PARTS, "url")),
        ({"WAKEUP_DATABASE": SECRET}, "settings", A_SECRET, SECRET_PARTS),
        ({"RQ_QUEUE": (SECRET,)}, "rq", "a tuple of 1 item(s)", SECRET_PARTS),
        ({"POLL_INTERVAL": float("-inf")}, "settings", "a float that is not finite", ("inf",)),
        ({"BATCH_SIZE": 2.5}, "settings", "a value of type float", ("2.5",)),
        ({"CONCURRENCY": True}, "settings", "a bool", ("True",)),
        ({"WAKEUP": None}, "settings", "None", ()),
    ],
)
def test_errors_name_the_type_of_a_bad_value_never_the_value(
    settings: dict[str, Any], check: str, got: str, hidden: tuple[str, ...]
) -> None:
    """Settings may hold secrets: a URL with credentials, a key."""
    from nexus_workflows.airtable.checks import check_airtable_settings
    from nexus_workflows.fire_and_forget.checks import check_rq_queues

    run = {"settings": check_settings, "airtable": check_airtable_settings, "rq": check_rq_queues}[check]
    with override_settings(NEXUS_WORKFLOWS=settings):
        (message,) = run()
    assert f"; got {got}." in message.msg
    for part in hidden:
        assert part not in message.msg + message.hint


def test_a_schedule_longer_than_the_retention_is_an_error(register_workflow: Any) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1, 120]).kind
    with override_settings(NEXUS_WORKFLOWS={"RETENTION": 3600}):
        messages = check_settings()
    assert ids(messages) == ["nexus_workflows.E007"]
    assert kind in messages[0].msg


def test_caps_and_serial_keys_on_a_database_without_partial_indexes_are_errors(
    register_workflow: Any,
) -> None:
    """The database enforces concurrency and serial_key (partial unique constraints);
    MySQL and MariaDB have no partial indexes (on MariaDB a second holder of a slot is
    written: tests/flow/test_claiming.py), so such kinds are refused there."""
    from django.db import connection

    from nexus_workflows.checks import check_flow_limits_guarded, flow_limit_errors

    def noop(t: Any, c: Any, s: Any) -> None:
        pass

    capped = register_workflow(noop, retry_schedule=[1], concurrency=2).kind
    serial = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: "k").kind
    rated = register_workflow(noop, retry_schedule=[1], rate_limit=(5, 1.0)).kind
    plain = register_workflow(noop, retry_schedule=[1]).kind
    messages = flow_limit_errors("MySQL", supports_partial_indexes=False)
    about = {kind: [m for m in messages if repr(kind) in m.msg] for kind in (capped, serial, rated, plain)}
    assert [ids(about[capped]), ids(about[serial])] == [["nexus_workflows.E009"]] * 2
    assert about[rated] == about[plain] == []
    assert "the MySQL database cannot enforce" in about[capped][0].msg
    assert flow_limit_errors("PostgreSQL", supports_partial_indexes=True) == []
    guarded = check_flow_limits_guarded()  # this database's
    if connection.features.supports_partial_indexes:  # SQLite and PostgreSQL
        assert guarded == []
    else:  # MariaDB; the test app registers no capped or keyed kind of its own here
        assert ids(guarded) == ["nexus_workflows.E009"] * 2
        assert all("the MySQL/MariaDB database cannot enforce" in m.msg for m in guarded)
        kinds = (capped, serial, rated, plain)
        assert {kind for kind in kinds if any(repr(kind) in m.msg for m in guarded)} == {capped, serial}


# Every check runs here, and on Django 6.1 JSONField's check asks SQLite whether it
# supports JSON: a query.
@pytest.mark.django_db
def test_commands_refuse_to_start_on_invalid_settings() -> None:
    with (
        override_settings(NEXUS_WORKFLOWS={"CONCURRENCY": -2}),
        pytest.raises(SystemCheckError, match="E003"),
    ):
        call_command("runworkflows", "--once", skip_checks=False)


def test_use_tz_false_is_an_error() -> None:
    from nexus_workflows.checks import check_time_zone_support

    assert check_time_zone_support() == []
    with override_settings(USE_TZ=False):
        (message,) = check_time_zone_support()
    assert message.id == "nexus_workflows.E008"
    assert "USE_TZ = True" in message.msg


@contextlib.contextmanager
def database_time_zone(name: str | None) -> Iterator[None]:
    """The default database's own ``TIME_ZONE`` (``DATABASES["default"]["TIME_ZONE"]``)."""
    from django.db import connection

    before = connection.settings_dict.get("TIME_ZONE")
    connection.settings_dict["TIME_ZONE"] = name
    for cached in ("timezone", "timezone_name"):
        connection.__dict__.pop(cached, None)
    try:
        yield
    finally:
        connection.settings_dict["TIME_ZONE"] = before
        for cached in ("timezone", "timezone_name"):
            connection.__dict__.pop(cached, None)


def test_a_database_time_zone_other_than_utc_is_an_error_where_datetimes_are_stored_naive() -> None:
    """SQLite and MySQL/MariaDB store datetimes without a zone: Django writes and reads
    them in the database's ``TIME_ZONE``, while the database's clock (every claim,
    heartbeat, due and finish time written in SQL) is UTC. Under America/Mexico_City an
    enqueue's delay of an hour was gone on SQLite (claimed at once), and on MariaDB every
    time the database wrote read six hours off. PostgreSQL stores the instant."""
    from django.db import connection

    from nexus_workflows.checks import check_time_zone_support

    for utc in (None, "UTC", "Etc/UTC"):
        with database_time_zone(utc):
            assert check_time_zone_support() == []
    with database_time_zone("America/Mexico_City"):
        messages = check_time_zone_support()
    if connection.vendor == "postgresql":
        assert messages == []
        return
    (message,) = messages
    assert message.id == "nexus_workflows.E010"
    assert "'default'" in message.msg
    assert "America/Mexico_City" in message.msg
    assert "UTC" in message.hint


def test_a_wakeup_database_must_be_postgresql() -> None:
    from django.db import connection

    with override_settings(NEXUS_WORKFLOWS={"WAKEUP_DATABASE": "default"}):
        messages = check_settings()
    if connection.vendor == "postgresql":
        assert messages == []  # the runner's own alias: nothing to warn about
    else:
        assert ids(messages) == ["nexus_workflows.E021"]
        assert "wake-ups (LISTEN/NOTIFY) need PostgreSQL" in messages[0].msg


@pytest.mark.postgresql
def test_a_pooled_alias_is_warned_about_session_state() -> None:
    """WAKEUP_DATABASE set: the runner's alias presumably goes through a pooler."""
    from django.db import connections

    settings_dict = connections.settings["default"]
    saved = {key: settings_dict.get(key) for key in ("OPTIONS", "DISABLE_SERVER_SIDE_CURSORS")}
    try:
        settings_dict["OPTIONS"] = {**(saved["OPTIONS"] or {}), "prepare_threshold": 5}
        settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = False
        with override_settings(NEXUS_WORKFLOWS={"WAKEUP_DATABASE": "direct"}):
            messages = check_settings()
        assert ids(messages) == ["nexus_workflows.W020", "nexus_workflows.W021"]
        assert "prepare_threshold" in messages[0].msg
        assert "DISABLE_SERVER_SIDE_CURSORS" in messages[1].msg
        settings_dict["OPTIONS"] = saved["OPTIONS"] or {}
        settings_dict["DISABLE_SERVER_SIDE_CURSORS"] = True
        with override_settings(NEXUS_WORKFLOWS={"WAKEUP_DATABASE": "direct"}):
            assert check_settings() == []
    finally:
        settings_dict.update(saved)


@pytest.mark.slow
@pytest.mark.parametrize("retention", ["86400", None, [86400], 0])
def test_a_retention_of_the_wrong_type_is_reported_by_manage_py_check(retention: Any) -> None:
    """The project's workflows register at start-up (autodiscover), before any check: a
    RETENTION of the wrong type made every command, check included, die with TypeError."""
    process = ManagePy("check", settings={"RETENTION": retention})
    assert process.process.wait(60) == 1
    output = process.output()
    process.close()
    assert "nexus_workflows.E002" in output
    assert "RETENTION" in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    "name",
    ["RETENTION", "STALE_AFTER", "PHI_CACHE_TTL", "AIRTABLE_RETRY_DEADLINE", "AIRTABLE_RATE_LIMIT_TIMEOUT"],
)
def test_a_setting_of_seconds_too_large_for_a_float_is_an_error_not_a_crash(name: str) -> None:
    from django.conf import settings
    from django.core.checks import ERROR, run_checks

    with override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, name: 10**400}):
        messages = run_checks()  # raised OverflowError: int too large to convert to float
    refused = [message for message in messages if message.level >= ERROR and f"'{name}'" in message.msg]
    assert len(refused) == 1, messages
    assert "10000" not in refused[0].msg  # named by type, never by value

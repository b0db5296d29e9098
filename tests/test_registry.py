from __future__ import annotations

import math
from typing import Any

import pytest
from django.test import override_settings

from nexus_workflows import AlreadyRegistered, RegistrationError, WorkflowError, register, workflow
from nexus_workflows.deferred.registry import registry


def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def key(trigger: Any) -> str:
    return "k"


@pytest.fixture(autouse=True)
def _forget_kinds() -> Any:
    before = set(registry.kinds())
    yield
    for kind in set(registry.kinds()) - before:
        registry.unregister(kind)


@pytest.mark.parametrize(
    ("kind", "rule"),
    [
        ("", "non-empty string"),
        (None, "non-empty string"),
        (42, "non-empty string"),
        ("send__summary", "must not contain '__'"),
        ("has space", "letters, digits"),
        ("dotted.kind", "letters, digits"),
        ("-leading-dash", "starting with a letter or digit"),
        ("x" * 101, "at most 100"),
    ],
)
def test_rejects_bad_kinds(kind: Any, rule: str) -> None:
    with pytest.raises(RegistrationError, match=rule):
        register(kind, dedupe_key=key, prepare=prepare, retry_schedule=[1])
    assert kind not in registry


@pytest.mark.parametrize(
    ("kind", "schedule"),
    [
        ("canary 8731 kind", [1]),
        ("canary__8731", [1]),
        ("8731" * 30, [1]),
        ("ok-kind", "canary 8731"),
        ("ok-kind", [1, "8731"]),
        ("ok-kind", [-8731.5]),
        ("ok-kind", [873100]),
    ],
)
def test_a_refused_registration_does_not_echo_the_bad_value(kind: str, schedule: Any) -> None:
    with pytest.raises(RegistrationError) as caught:
        register(kind, dedupe_key=key, prepare=prepare, retry_schedule=schedule)
    assert "8731" not in str(caught.value)


def test_rejects_a_kind_registered_twice_and_keeps_the_first() -> None:
    first = register("twice", dedupe_key=key, prepare=prepare, retry_schedule=[1])
    with pytest.raises(AlreadyRegistered, match="'twice' is already registered"):
        register("twice", dedupe_key=key, prepare=lambda t: None)
    assert registry.get("twice") is first


def test_rejects_non_callables_naming_the_kind() -> None:
    with pytest.raises(RegistrationError, match="workflow 'no-key': dedupe_key must be callable"):
        register("no-key", dedupe_key="trigger.id", prepare=prepare)  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match="workflow 'no-prepare': prepare must be callable"):
        register("no-prepare", dedupe_key=key, prepare=None)  # type: ignore[arg-type]
    assert "no-key" not in registry
    assert "no-prepare" not in registry


def test_rejects_prepare_with_the_wrong_arity() -> None:
    with pytest.raises(RegistrationError, match="must accept \\(trigger, checkpoints, save\\)"):
        register("arity", dedupe_key=key, prepare=lambda trigger: None, retry_schedule=[1])
    with pytest.raises(RegistrationError, match="dedupe_key must accept one argument"):
        register("arity", dedupe_key=lambda: "k", prepare=prepare, retry_schedule=[1])


@pytest.mark.parametrize(
    ("schedule", "rule"),
    [
        ([], "non-empty list of minutes"),
        ("5,10", "non-empty list of minutes"),
        (5, "non-empty list of minutes"),
        ([5, "10"], r"retry_schedule\[1\] must be a number"),
        ([True], r"retry_schedule\[0\] must be a number"),
        ([0], "greater than zero"),
        ([-1], "greater than zero"),
        ([math.nan], "finite"),
        ([math.inf], "finite"),
        ([10**400], r"at most 5,260,320 minutes \(ten years\); got more"),  # was OverflowError
        ([5, 1440], "not shorter than the retention of 1440 minutes"),
    ],
)
def test_rejects_bad_retry_schedules(schedule: Any, rule: str) -> None:
    with pytest.raises(RegistrationError, match=rule) as raised:
        register("scheduled", dedupe_key=key, prepare=prepare, retry_schedule=schedule)
    assert "'scheduled'" in str(raised.value)
    assert "scheduled" not in registry


def test_schedule_limit_follows_the_retention_setting() -> None:
    with override_settings(NEXUS_WORKFLOWS={"RETENTION": 600}):
        with pytest.raises(RegistrationError, match="retention of 10 minutes"):
            register("short-retention", dedupe_key=key, prepare=prepare, retry_schedule=[10])
        registered = register("short-retention", dedupe_key=key, prepare=prepare, retry_schedule=[9.5])
    assert registered.retry_schedule == (9.5,)


@pytest.mark.parametrize("retention", ["86400", None, [86400], 0, 10**400])
def test_a_retention_that_is_no_number_of_seconds_is_left_to_the_system_check(retention: Any) -> None:
    """Compared with here, it raised TypeError (OverflowError) from every command's start-up,
    ``manage.py check`` included, which reports it as E002."""
    with override_settings(NEXUS_WORKFLOWS={"RETENTION": retention}):
        registered = register("any-retention", dedupe_key=key, prepare=prepare, retry_schedule=[9.5])
    assert registered.retry_schedule == (9.5,)


def test_registration_errors_share_one_base_class() -> None:
    assert issubclass(RegistrationError, WorkflowError)
    assert issubclass(AlreadyRegistered, WorkflowError)


def test_workflow_decorator_registers_and_returns_the_function() -> None:
    @workflow("decorated", dedupe_key=key, retry_schedule=[1, 2])
    def decorated(trigger: Any, checkpoints: Any, save: Any) -> str:
        return "ran"

    registered = registry.get("decorated")
    assert registered.prepare is decorated
    assert registered.is_deferred
    assert registered.max_attempts == 3
    assert registered.delay_after(0).total_seconds() == 60
    assert registered.delay_after(2) is None
    assert decorated(None, {}, None) == "ran"


def test_without_schedule_a_workflow_is_fire_and_forget() -> None:
    registered = register("fire", dedupe_key=key, prepare=lambda trigger: None)
    assert not registered.is_deferred
    assert "fire" in registry.kinds(deferred=False)
    assert "fire" not in registry.kinds(deferred=True)


def test_async_prepare_is_recognised() -> None:
    async def prepare_async(trigger: Any, checkpoints: Any, save: Any) -> None:
        pass

    assert register("async-kind", dedupe_key=key, prepare=prepare_async, retry_schedule=[1]).is_async


def test_workflows_modules_of_installed_apps_are_discovered() -> None:
    # tests.testapp.workflows and project.demo.workflows are imported by AppConfig.ready().
    assert {"test-ledger", "test-two-steps", "demo-greet", "demo-flaky"} <= set(registry.kinds())


def test_an_unknown_kind_asked_for_is_not_echoed_but_a_stored_rows_kind_is_named() -> None:
    """A kind passed by a caller may be anything (it is described, not repeated); the kind
    of a claimed row was registered where it was enqueued, so the runner names it."""
    from nexus_workflows.deferred.transitions import ClaimedWork
    from nexus_workflows.exceptions import UnknownWorkflow

    register("known-kind", prepare=prepare, dedupe_key=key, retry_schedule=[1])
    with pytest.raises(UnknownWorkflow) as asked:
        registry.get("+52 55 1234 5678")
    assert "1234" not in str(asked.value)
    assert "a string of 16 character(s)" in str(asked.value)
    assert "known-kind" in str(asked.value)

    stored = ClaimedWork(
        id=1,
        kind="removed-kind",
        dedupe_key="k",
        trigger={},
        checkpoints={},
        attempt=1,
        history=[],
        claim_token="",
    )
    with pytest.raises(UnknownWorkflow, match="registered for kind 'removed-kind' in this process"):
        registry.for_work(stored)


@pytest.mark.parametrize("option", ["dedupe_key", "serial_key", "rate_key"])
def test_an_async_key_function_is_refused_at_registration(option: str) -> None:
    """enqueue calls key functions synchronously: an async one returned a coroutine, and
    every enqueue failed later (with a "never awaited" warning)."""

    async def async_key(trigger: Any) -> str:
        return "k"

    options: dict[str, Any] = {"dedupe_key": key, option: async_key}
    if option == "rate_key":
        options["rate_limit"] = (1, 1.0)
    with pytest.raises(RegistrationError, match=f"{option} must be a plain function, not async def"):
        register("async-keyed", prepare=prepare, retry_schedule=[1], **options)
    assert "async-keyed" not in registry

"""Registration rules of the flow options, and keys computed at enqueue."""

from __future__ import annotations

from typing import Any

import pytest

from nexus_workflows import InvalidFlowKey, RegistrationError, enqueue, enqueue_many
from nexus_workflows.models import DeferredWork


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"concurrency": 0}, "concurrency must be a whole number from 1 to 10,000"),
        ({"concurrency": -2}, "concurrency must be a whole number from 1 to 10,000"),
        ({"concurrency": 2.5}, "concurrency must be a whole number from 1 to 10,000"),
        ({"concurrency": True}, "concurrency must be a whole number from 1 to 10,000"),
        ({"concurrency": 10_001}, "concurrency must be a whole number from 1 to 10,000"),
        ({"rate_limit": (0, 1)}, "rate_limit must be a pair (limit, period_seconds)"),
        ({"rate_limit": (5, 0)}, "the period is an int outside that range"),
        ({"rate_limit": (5, -1.0)}, "rate_limit must be a pair"),
        ({"rate_limit": 5}, "rate_limit must be a pair"),
        ({"rate_limit": ("5", 1)}, "the limit is a str"),
        ({"rate_limit": (5, float("inf"))}, "the period is a float that is not finite"),
        ({"rate_limit": (10**7, 1)}, "the limit is an int outside that range"),
        ({"rate_limit": (2, 1e15)}, "at most 31,622,400 (a year); the period is a float outside that range"),
        ({"serial_key": "to"}, "serial_key must be a function of one argument"),
        ({"serial_key": lambda a, b: a}, "serial_key must be a function of one argument"),
        ({"rate_limit": (5, 1), "rate_key": 3}, "rate_key must be a function of one argument"),
        ({"rate_key": lambda t: "x"}, "rate_key needs a rate_limit"),
        ({"ordered": True}, "ordered=True needs a serial_key"),
        ({"serial_key": lambda t: "x", "ordered": "yes"}, "ordered must be True or False"),
    ],
)
def test_bad_flow_options_are_refused_naming_the_option(
    register_workflow: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(RegistrationError) as caught:
        register_workflow(noop, retry_schedule=[1], **options)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "options",
    [
        {"concurrency": 98765},
        {"concurrency": 98765.5},
        {"rate_limit": (98765, 1)},
        {"rate_limit": (5, -98765.5)},
        {"rate_limit": (5, "98765")},
        {"rate_limit": (5, 98765 * 10**400)},  # an int no float holds: OverflowError before
    ],
)
def test_a_refused_flow_option_does_not_echo_its_value(
    register_workflow: Any, options: dict[str, Any]
) -> None:
    with pytest.raises(RegistrationError) as caught:
        register_workflow(noop, retry_schedule=[1], **options)
    assert "98765" not in str(caught.value)


def test_a_misspelt_option_of_the_decorator_is_refused_naming_it() -> None:
    from nexus_workflows import workflow
    from nexus_workflows.deferred.registry import registry

    with pytest.raises(RegistrationError) as caught:
        workflow("t-misspelt", dedupe_key=str, retry_schedule=[1], concurency=2)
    assert "unknown option 'concurency'; the options are dedupe_key, retry_schedule, concurrency" in str(
        caught.value
    )
    assert "t-misspelt" not in registry.kinds()


@pytest.mark.parametrize(
    "options",
    [{"concurrency": 2}, {"serial_key": lambda t: "x"}, {"rate_limit": (5, 1)}],
)
def test_fire_and_forget_workflows_refuse_flow_options(
    register_workflow: Any, options: dict[str, Any]
) -> None:
    with pytest.raises(RegistrationError, match="applies to deferred workflows only"):
        register_workflow(lambda trigger: None, **options)


def test_good_options_are_kept_and_described(register_workflow: Any) -> None:
    workflow = register_workflow(
        noop,
        retry_schedule=[1],
        concurrency=3,
        serial_key=lambda t: t["to"],
        ordered=True,
        rate_limit=(20, 1),
        rate_key=lambda t: t["from"],
    )
    assert workflow.flow is not None
    assert workflow.flow.describe() == "concurrency 3, serial key, ordered, rate 20 per 1s per rate key"
    assert register_workflow(noop, retry_schedule=[1]).flow is None


@pytest.mark.django_db
@pytest.mark.parametrize("bad", [7, b"bytes", ["list"]])
def test_a_key_function_returning_a_non_string_writes_nothing(register_workflow: Any, bad: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: bad).kind
    with pytest.raises(InvalidFlowKey, match=f"serial_key returned {type(bad).__name__}") as caught:
        enqueue(kind, {"key": 1, "phone": "+5215555550000"})
    assert "5555" not in str(caught.value)
    with pytest.raises(InvalidFlowKey):
        enqueue_many(kind, [{"key": 2}, {"key": 3}])
    assert not DeferredWork.objects.filter(kind=kind).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("bad", ["cut emoji \ud83d", "before\x00after"])
@pytest.mark.parametrize("rule", ["serial_key", "rate_key"])
def test_a_key_function_returning_text_that_cannot_be_hashed_writes_nothing(
    register_workflow: Any, bad: str, rule: str
) -> None:
    options: dict[str, Any] = {rule: lambda t: bad}
    if rule == "rate_key":
        options["rate_limit"] = (5, 1)
    kind = register_workflow(noop, retry_schedule=[1], **options).kind
    with pytest.raises(InvalidFlowKey, match=f"{rule} returned a string that contains"):
        enqueue(kind, {"key": 1})
    assert not DeferredWork.objects.filter(kind=kind).exists()


@pytest.mark.django_db
def test_a_key_function_that_raises_writes_nothing(register_workflow: Any) -> None:
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(1, 1), rate_key=lambda t: t["sender"]).kind
    with pytest.raises(InvalidFlowKey, match="rate_key raised KeyError"):
        enqueue(kind, {"key": 1})
    assert not DeferredWork.objects.filter(kind=kind).exists()


@pytest.mark.django_db
def test_equal_keys_hash_alike_and_differ_between_kinds(register_workflow: Any) -> None:
    a = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: t["to"]).kind
    b = register_workflow(noop, retry_schedule=[1], serial_key=lambda t: t["to"]).kind
    enqueue(a, {"key": 1, "to": "+5215555550000"})
    enqueue_many(a, [{"key": 2, "to": "+5215555550000"}, {"key": 3, "to": "other"}])
    enqueue(b, {"key": 1, "to": "+5215555550000"})
    values = DeferredWork.objects.values_list("kind", "dedupe_key", "serial_key_hash")
    rows = {(kind, key): hashed for kind, key, hashed in values}
    assert rows[(a, "1")] == rows[(a, "2")] != rows[(a, "3")]
    assert rows[(a, "1")] != rows[(b, "1")]

"""Hostile inputs to enqueue and enqueue_many: the app's own error, or an exact round trip.

For every trigger, either :class:`InvalidTrigger` (nothing written, the caller's
transaction still usable) or a stored trigger that comes back equal and of the same
types, recursively. Run on SQLite and on PostgreSQL (whose jsonb is the one that changes
numbers), by hand-written cases and by Hypothesis.
"""

from __future__ import annotations

import enum
import itertools
import traceback
from collections import OrderedDict
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexus_workflows import (
    EnqueueRejected,
    InvalidDedupeKey,
    InvalidEnqueueOption,
    InvalidTrigger,
    WorkflowError,
    enqueue,
    enqueue_many,
    sql,
)
from nexus_workflows.fire_and_forget import get_queue
from nexus_workflows.fire_and_forget.sealing import open_trigger
from nexus_workflows.json_values import MAX_DEPTH
from nexus_workflows.limits import MAX_DELAY
from nexus_workflows.models import DeferredWork
from nexus_workflows.sql.mysql import JSON_DEPTH_LIMIT
from tests.json_like import json_like, nested, same, valid_json

pytestmark = pytest.mark.django_db

_keys = itertools.count(1)


def noop(trigger: Any, checkpoints: Any = None, save: Any = None) -> None:
    pass


@pytest.fixture
def deferred(register_workflow: Any) -> str:
    """A deferred kind whose dedupe key does not depend on the trigger (so any trigger,
    however odd, reaches the trigger checks)."""
    return register_workflow(noop, dedupe_key=lambda trigger: f"k{next(_keys)}", retry_schedule=[1]).kind


class Colour(enum.IntEnum):
    RED = 1


class Text(str):
    pass


def cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {"a": []}
    value["a"].append(value)
    return value


STORED = [
    {"k": None},
    "C:\\u0000\\dir",  # a backslash and "u0000": text, not a NUL
    {"path": "C:\\u0000\\dir"},
    "null",
    0.0,
    9999999999999998.0,
    -9999999999999998.0,
    1e15 + 0.5,
    5e-324,
    1e-7,
    2**63 - 1,
    -(2**63),
    True,
    "\U0001f600 \uffff \u2028 é",
    [],
    {},
    {"shared": [[1], [1]]},
]
#: The deepest trigger the app takes when the database takes it too (on MariaDB, whose JSON
#: documents nest at most 31 deep, see test_a_trigger_as_deep_as_the_database_stores…).
DEEPEST = nested(MAX_DEPTH)

REFUSED = [
    (None, "is None"),
    ({1: "a"}, "dict key of type int"),
    ({True: 1}, "dict key of type bool"),
    ({1: "a", "1": "b"}, "dict key of type int"),
    ({None: 1}, "dict key of type NoneType"),
    ("\ud800", "not valid Unicode"),
    ({"\udfff": 1}, "dict key that contains text that is not valid Unicode"),
    ("a\x00b", "NUL character"),
    ({"a\x00": 1}, "NUL character"),
    (1e16, "1e16 or more"),
    (1e20, "1e16 or more"),
    (1e308, "1e16 or more"),
    (-1e20, "1e16 or more"),
    (-0.0, "-0.0"),
    ([1, -0.0], "-0.0"),
    (float("nan"), "NaN or infinity"),
    (float("-inf"), "NaN or infinity"),
    (2**63, "outside -2\\*\\*63"),
    (-(2**63) - 1, "outside -2\\*\\*63"),
    (10**5000, "outside -2\\*\\*63"),
    # The number: the app's limit, or the database's where lower (the test after the next).
    (nested(MAX_DEPTH + 1), "nested more than [0-9]+ containers deep"),
    (nested(10_000), "nested more than [0-9]+ containers deep"),
    (cyclic(), "circular reference"),
    ((1, 2), "type tuple; use a list"),
    (OrderedDict(a=1), "type OrderedDict, a subclass"),
    (Colour.RED, "type Colour, a subclass"),
    (Text("x"), "type Text, a subclass"),
    (b"bytes", "type bytes"),
    ({1, 2}, "type set"),
]


@pytest.mark.parametrize("trigger", STORED, ids=repr)
def test_accepted_triggers_come_back_equal_and_of_the_same_types(deferred: str, trigger: Any) -> None:
    work_id = enqueue(deferred, trigger)
    assert same(DeferredWork.objects.get(pk=work_id).trigger, trigger)
    (many_id,) = enqueue_many(deferred, [trigger])
    assert same(DeferredWork.objects.get(pk=many_id).trigger, trigger)


@pytest.mark.parametrize(("trigger", "rule"), REFUSED, ids=[rule for _, rule in REFUSED])
def test_refused_triggers_raise_invalid_trigger_and_write_nothing(
    deferred: str, trigger: Any, rule: str
) -> None:
    with pytest.raises(InvalidTrigger, match=rule) as raised:
        enqueue(deferred, trigger)
    message = str(raised.value)
    assert f"workflow {deferred!r}" in message
    assert "allowed:" in message
    with pytest.raises(InvalidTrigger, match=rule):
        enqueue_many(deferred, [{"fine": 1}, trigger])
    assert not DeferredWork.objects.exists()
    # The test's transaction (a caller's, for enqueue) is still usable.
    assert enqueue(deferred, {"fine": 1}) is not None


def test_a_trigger_as_deep_as_the_database_stores_is_accepted_and_one_deeper_refused(deferred: str) -> None:
    """The app's limit (64 containers), or the database's own where lower: MariaDB's
    JSON_VALID, the CHECK of its JSON columns, refuses 32. One deeper is the app's
    InvalidTrigger, saying the limit, never a database refusal ("a constraint or trigger
    added to the table") after the INSERT."""
    depth = sql.json_depth("default")
    assert depth == (JSON_DEPTH_LIMIT if connection.vendor == "mysql" else MAX_DEPTH)
    work_id = enqueue(deferred, nested(depth))
    assert same(DeferredWork.objects.get(pk=work_id).trigger, nested(depth))
    (many_id,) = enqueue_many(deferred, [{"a": nested(depth - 1)}])
    assert same(DeferredWork.objects.get(pk=many_id).trigger, {"a": nested(depth - 1)})
    too_deep = (lambda: enqueue(deferred, nested(depth + 1)), lambda: enqueue_many(deferred, [[DEEPEST]]))
    for attempt in too_deep:
        with pytest.raises(InvalidTrigger, match=f"nested more than {depth} containers deep") as raised:
            attempt()
        assert f"nested at most {depth} deep" in str(raised.value)
    assert DeferredWork.objects.count() == 2


def test_refusals_never_echo_the_value(deferred: str) -> None:
    for trigger in ({"María López": 1.5e300}, {"name": "María\x00López"}, {1: "María López"}):
        with pytest.raises(InvalidTrigger) as raised:
            enqueue(deferred, trigger)
        assert "María" not in str(raised.value)
        assert "López" not in str(raised.value)


@pytest.mark.parametrize(
    ("key", "rule"),
    [("\ud800", "not valid Unicode"), ("a\udc80b", "not valid Unicode"), ("a\x00", "NUL character")],
)
def test_dedupe_keys_that_are_not_valid_unicode_text_are_refused(
    register_workflow: Any, key: str, rule: str
) -> None:
    kind = register_workflow(noop, dedupe_key=lambda trigger: key, retry_schedule=[1]).kind
    with pytest.raises(InvalidDedupeKey, match=rule):
        enqueue(kind, {"a": 1})
    with pytest.raises(InvalidDedupeKey, match=rule):
        enqueue_many(kind, [{"a": 1}])
    assert not DeferredWork.objects.exists()


@pytest.mark.parametrize(
    ("delay", "rule"),
    [
        (1e20, "too long"),
        (10**30, "too long"),
        (10**400, "too long"),
        (timedelta.max, "too long"),
        (MAX_DELAY + timedelta(seconds=1), "too long"),
        (MAX_DELAY.total_seconds() + 1, "too long"),
        (-1, "must not be negative"),
        (timedelta.min, "must not be negative"),
        (float("nan"), "finite number of seconds or a timedelta"),
        (float("inf"), "finite number of seconds or a timedelta"),
        (True, "finite number of seconds or a timedelta; got bool"),
        ("soon", "finite number of seconds or a timedelta; got str"),
    ],
)
def test_delays_outside_the_allowed_range_are_refused(deferred: str, delay: Any, rule: str) -> None:
    with pytest.raises(InvalidEnqueueOption, match=rule) as raised:
        enqueue(deferred, {"a": 1}, delay=delay)
    assert "allowed" in str(raised.value) or "got" in str(raised.value)
    with pytest.raises(InvalidEnqueueOption, match=rule):
        enqueue_many(deferred, [{"a": 1}], delay=delay)
    assert not DeferredWork.objects.exists()


def test_the_longest_delay_is_accepted(deferred: str) -> None:
    for delay in (MAX_DELAY, MAX_DELAY.total_seconds(), 0, 0.5):
        assert enqueue(deferred, {"a": 1}, delay=delay) is not None


# --- database refusals that are not the dedupe race -----------------------------------------


@pytest.fixture
def one_visit_per_row() -> Iterator[None]:
    """A project's own unique index on the trigger's ``visit``. MariaDB indexes no
    expression: a virtual column of it, indexed. Removed afterwards (the tests using it are
    transactional: on MariaDB DDL commits at once)."""
    table = connection.ops.quote_name(DeferredWork._meta.db_table)
    trigger = connection.ops.quote_name("trigger")  # a reserved word in MySQL
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                f"ALTER TABLE {table} ADD COLUMN nw_test_visit VARCHAR(32) "
                f"AS (JSON_VALUE({trigger}, '$.visit')) VIRTUAL, "
                "ADD UNIQUE INDEX nw_test_one_visit (nw_test_visit)"
            )
        else:
            postgres = connection.vendor == "postgresql"
            visit = f"({trigger} ->> 'visit')" if postgres else f"json_extract({trigger}, '$.visit')"
            cursor.execute(f"CREATE UNIQUE INDEX nw_test_one_visit ON {table} (({visit}))")
    yield
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"ALTER TABLE {table} DROP COLUMN nw_test_visit")
        else:
            cursor.execute("DROP INDEX IF EXISTS nw_test_one_visit")


@pytest.mark.django_db(transaction=True)
def test_an_integrity_error_that_is_not_the_dedupe_constraint_is_the_apps_error(
    register_workflow: Any, project_refusal: Any
) -> None:
    kind = register_workflow(noop, dedupe_key=lambda trigger: trigger["key"], retry_schedule=[1]).kind
    project_refusal.install("dedupe_key", "forbidden-key")
    with transaction.atomic():  # the caller's transaction
        with pytest.raises(EnqueueRejected, match="the database refused the new work") as raised:
            enqueue(kind, {"key": "forbidden-key"})
        assert raised.value.__cause__ is None  # the driver's message may quote the row
        assert "forbidden-key" not in str(raised.value)
        # Not retried as a dedupe race, nothing written, and the transaction goes on.
        assert enqueue(kind, {"key": "fine"}) is not None
    with pytest.raises(EnqueueRejected):
        enqueue_many(kind, [{"key": "also-fine"}, {"key": "forbidden-key"}])
    assert list(DeferredWork.objects.values_list("dedupe_key", flat=True)) == ["fine"]
    if connection.vendor != "sqlite":  # SQLite's message names no trigger
        assert "nw_test_refused" in str(raised.value)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("one_visit_per_row")
def test_another_unique_constraint_is_a_refusal_not_a_dedupe_race(register_workflow: Any) -> None:
    """On PostgreSQL enqueue skips only a taken dedupe key (ON CONFLICT ON CONSTRAINT): a
    project's own unique index still refuses the row, with the app's error."""
    kind = register_workflow(noop, dedupe_key=lambda trigger: trigger["key"], retry_schedule=[1]).kind
    first = enqueue(kind, {"key": "first", "visit": "v-7"})
    with transaction.atomic():  # the caller's transaction
        with pytest.raises(EnqueueRejected, match="the database refused the new work") as raised:
            enqueue(kind, {"key": "second", "visit": "v-7"})
        assert raised.value.__cause__ is None
        assert "v-7" not in str(raised.value)
        assert "second" not in str(raised.value)
        assert enqueue(kind, {"key": "third", "visit": "v-8"}) is not None  # still usable
    assert enqueue(kind, {"key": "first", "visit": "v-9"}) == first  # the dedupe key: no refusal
    if connection.vendor != "sqlite":  # SQLite names the columns, not the index
        assert "nw_test_one_visit" in str(raised.value)
    if connection.vendor == "postgresql":
        # Both taken: the dedupe key is checked first (ON CONFLICT's arbiter), so a repeat
        # of the very trigger is the dedupe case. (SQLite reports whichever index it checks
        # first, here the project's.)
        assert enqueue(kind, {"key": "first", "visit": "v-7"}) == first
    assert sorted(DeferredWork.objects.values_list("dedupe_key", flat=True)) == ["first", "third"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("one_visit_per_row")
def test_enqueue_many_refuses_a_row_another_unique_constraint_refuses(register_workflow: Any) -> None:
    """enqueue_many skips only taken dedupe keys (PostgreSQL: ON CONFLICT ON CONSTRAINT;
    SQLite: what INSERT OR IGNORE skipped is inserted again one by one): a row that a
    project's own unique index refuses is the app's error and nothing of the batch is
    written, as with enqueue (it was skipped as if its key were taken, looked for, and
    ended in "could not settle … after 5 rounds")."""
    kind = register_workflow(noop, dedupe_key=lambda trigger: trigger["key"], retry_schedule=[1]).kind
    enqueue(kind, {"key": "first", "visit": "v-7"})
    refused = "the database refused the new work" if connection.vendor == "sqlite" else "nw_test_one_visit"
    with pytest.raises(EnqueueRejected, match=refused) as raised:
        enqueue_many(kind, [{"key": "second", "visit": "v-8"}, {"key": "third", "visit": "v-7"}])
    assert "v-7" not in str(raised.value)
    assert "third" not in str(raised.value)
    assert list(DeferredWork.objects.values_list("dedupe_key", flat=True)) == ["first"]
    # A taken dedupe key is still no refusal.
    assert enqueue_many(kind, [{"key": "first", "visit": "v-7"}, {"key": "fourth", "visit": "v-9"}])[1]


@pytest.mark.django_db(transaction=True)
def test_refusals_outside_a_transaction_write_nothing(register_workflow: Any) -> None:
    kind = register_workflow(noop, dedupe_key=lambda trigger: trigger["key"], retry_schedule=[1]).kind
    for trigger in ({"key": "a", "n": 2**64}, {"key": "b", "s": "\ud800"}, {"key": "c", 1: 2}):
        with pytest.raises(InvalidTrigger):
            enqueue(kind, trigger)
    assert not DeferredWork.objects.exists()
    assert enqueue(kind, {"key": "d"}) is not None


# --- fire-and-forget follows the same rules -------------------------------------------------


@pytest.mark.redis
@pytest.mark.parametrize(("trigger", "rule"), REFUSED[:12], ids=[rule for _, rule in REFUSED[:12]])
def test_fire_and_forget_refuses_the_same_triggers(
    register_workflow: Any, rq_redis: Any, trigger: Any, rule: str
) -> None:
    kind = register_workflow(noop, dedupe_key=lambda trigger: "one").kind
    with pytest.raises(InvalidTrigger, match=rule):
        enqueue(kind, trigger)
    with pytest.raises(InvalidTrigger, match=rule):
        enqueue_many(kind, [trigger])
    assert rq_redis.dbsize() == 0


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)  # outside a transaction the job is sent at once
def test_fire_and_forget_stores_accepted_triggers_exactly(register_workflow: Any, rq_redis: Any) -> None:
    kind = register_workflow(noop, dedupe_key=lambda trigger: f"k{next(_keys)}").kind
    queue = get_queue("default")
    for trigger in [*STORED, DEEPEST]:  # no database: the app's own limit
        job_id = enqueue(kind, trigger)
        assert job_id is not None
        job = queue.fetch_job(job_id)
        assert same(open_trigger(job_id, job.args[1]), trigger)  # as prepare will receive it


# --- property: any JSON-like value ---------------------------------------------------------

# Modest, so the suite stays fast; PostgreSQL's leg is the one that matters for numbers.
PROPERTY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@PROPERTY
@given(trigger=json_like)
def test_any_trigger_is_refused_or_stored_exactly(deferred: str, trigger: Any) -> None:
    before = DeferredWork.objects.count()
    try:
        work_id = enqueue(deferred, trigger)
    except InvalidTrigger:
        assert DeferredWork.objects.count() == before  # a query: the transaction is usable
        return
    assert same(DeferredWork.objects.get(pk=work_id).trigger, trigger)


@PROPERTY
@given(trigger=valid_json)
def test_any_valid_trigger_is_stored_exactly(deferred: str, trigger: Any) -> None:
    """The other half of the property above, which would hold if every value were refused."""
    work_id = enqueue(deferred, trigger)
    assert same(DeferredWork.objects.get(pk=work_id).trigger, trigger)


@PROPERTY
@given(triggers=st.lists(json_like, min_size=1, max_size=3))
def test_any_batch_is_refused_or_stored_exactly(deferred: str, triggers: list[Any]) -> None:
    before = DeferredWork.objects.count()
    try:
        ids = enqueue_many(deferred, triggers)
    except InvalidTrigger:
        assert DeferredWork.objects.count() == before
        return
    stored = DeferredWork.objects.in_bulk([int(work_id) for work_id in ids])
    for work_id, trigger in zip(ids, triggers, strict=True):
        assert same(stored[int(work_id)].trigger, trigger)


@pytest.mark.postgresql
def test_the_number_rules_are_what_jsonb_does(deferred: str) -> None:
    """Written past the checks, straight through the ORM: where the rules draw the line is
    where PostgreSQL's jsonb starts to change numbers."""
    changed = {"big": 1e16, "huge": 1e308, "minus_zero": -0.0}
    kept = {"below": 9999999999999998.0, "tiny": 5e-324, "small": 1e-7, "int": 2**63 - 1}
    work = DeferredWork.objects.create(kind=deferred, dedupe_key="raw", trigger={**changed, **kept})
    stored = DeferredWork.objects.get(pk=work.pk).trigger
    assert type(stored["big"]) is int
    assert type(stored["huge"]) is int
    assert str(stored["minus_zero"]) == "0.0"
    assert all(same(stored[name], value) for name, value in kept.items())


@pytest.mark.parametrize("rule", ["dedupe_key", "serial_key", "rate_key"])
def test_a_raising_key_function_is_reported_where_it_raised_without_its_message(
    register_workflow: Any, rule: str
) -> None:
    """A traceback logger (Django's request log, an error tracker) prints the chained
    cause: it would carry the trigger's value the key function choked on."""

    def int_visit(trigger: Any) -> str:
        return str(int(trigger["visit"]))

    options: dict[str, Any] = {rule: int_visit}
    if rule == "rate_key":
        options["rate_limit"] = (10, 1.0)
    if rule != "dedupe_key":
        options["dedupe_key"] = lambda trigger: "one"
    kind = register_workflow(noop, retry_schedule=[1], **options).kind
    patient = "María López +52 55 1234 5678"  # not on the line the traceback quotes
    with pytest.raises(WorkflowError) as raised:
        enqueue(kind, {"visit": patient})
    message = str(raised.value)
    assert f"{rule} raised ValueError (test_enqueue_inputs.py:" in message
    assert "in int_visit) for this trigger" in message
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__
    rendered = "".join(traceback.format_exception(raised.value))
    assert "María" not in rendered
    assert "1234" not in rendered
    assert not DeferredWork.objects.exists()


@pytest.mark.redis
@pytest.mark.parametrize("triggers", [None, 5, {"key": "one trigger"}, "abc", b"abc"])
@pytest.mark.parametrize("deferred", [True, False], ids=["deferred", "fire-and-forget"])
def test_enqueue_many_refuses_what_is_not_many_triggers(
    register_workflow: Any, rq_redis: Any, triggers: Any, deferred: bool
) -> None:
    """A dict or a string is one trigger: enqueueing its keys or letters would be a
    silent mistake; None or a number is no iterable at all."""
    schedule = [1] if deferred else None
    kind = register_workflow(noop, retry_schedule=schedule).kind
    with pytest.raises(InvalidTrigger, match=r"triggers must be an iterable of triggers, such as a list"):
        enqueue_many(kind, triggers)
    assert not DeferredWork.objects.exists()
    assert rq_redis.dbsize() == 0


@pytest.mark.redis
def test_fire_and_forget_enqueue_many_checks_its_options_even_without_triggers(
    register_workflow: Any, rq_redis: Any
) -> None:
    kind = register_workflow(noop).kind
    with pytest.raises(InvalidEnqueueOption, match="unknown option"):
        enqueue_many(kind, [], bogus=1)

"""A canary sweep: patient data pushed through the deferred path's entry points (bad
enqueues, failing and async prepares, bad checkpoints, flow keys, the CLI, the admin's
list pages, the metrics view) must reach none of the places the README keeps it out of:
any logger at DEBUG, exception messages and their chains, CLI output, list pages, metrics,
and the database outside the work table's own columns (flow keys are stored hashed)."""

from __future__ import annotations

import io
import logging
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client

from nexus_workflows import PermanentError, WorkflowError, enqueue, enqueue_many
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.models import DeferredWork

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "Zorbatilde Quixhuatl"
PHONE = "+52 55 8731 4926"
EMAIL = "zorba.quix@canary-mail.example"
# What a leak looks like, whatever the case or the phone's grouping.
MARKS = ("zorbatilde", "quixhuatl", "8731 4926", "87314926", "zorba.quix", "canary-mail")
TRIGGER = {"name": NAME, "phone": PHONE, "email": EMAIL}
# Where the README keeps patient data: the work table's own columns (the admin shows them
# only behind the reveal permission).
WORK_COLUMNS = {"trigger", "checkpoints", "last_error", "history", "dedupe_key"}


def leaks(text: str) -> list[str]:
    lowered = text.lower()
    return [mark for mark in MARKS if mark in lowered]


class _Everything(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "".join(traceback.format_exception(*record.exc_info))
        self.lines.append(f"{record.name}: {text} {record.args!r}")


@pytest.fixture
def every_log() -> Iterator[_Everything]:
    """Every logger there is (the project's nexus_workflows logger does not propagate), at DEBUG."""
    handler = _Everything()
    names = list(logging.root.manager.loggerDict)
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in names)]
    levels = [(logger, logger.level) for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield handler
    for logger, level in levels:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _raising_key(trigger: Any) -> str:
    raise ValueError(f"no visit for {trigger['name']}")


def _fails(trigger: Any, checkpoints: Any, save: Any) -> None:
    save({"phone": trigger["phone"]})
    raise ConnectionError(f"patient {trigger['name']} {trigger['phone']} not found")


def _refused(trigger: Any, checkpoints: Any, save: Any) -> None:
    raise PermanentError(f"rejected {trigger['email']}")


def _bad_checkpoint(trigger: Any, checkpoints: Any, save: Any) -> None:
    save({trigger["name"]: float("nan")})


async def _async_fails(trigger: Any, checkpoints: Any, save: Any) -> None:
    await save({"email": trigger["email"]})
    raise SystemExit(f"gave up on {trigger['name']}")


def test_canaries_reach_no_log_message_output_page_metric_or_hashed_column(
    register_workflow: Callable[..., Any], every_log: _Everything, django_user_model: type[User]
) -> None:
    seen: list[tuple[str, str]] = []
    by_name = {"dedupe_key": lambda t: t["name"], "retry_schedule": [1]}
    flow = {"serial_key": lambda t: t["phone"], "rate_limit": (5, 1), "rate_key": lambda t: t["email"]}
    kind = register_workflow(_fails, **flow, **by_name).kind
    others = (_refused, _bad_checkpoint, _async_fails)
    kinds = [kind] + [register_workflow(prepare, **by_name).kind for prepare in others]
    bad_key = register_workflow(_fails, dedupe_key=_raising_key, retry_schedule=[1]).kind
    too_long = register_workflow(_fails, dedupe_key=lambda t: t["name"] * 20, retry_schedule=[1]).kind

    refusals: list[Callable[[], Any]] = [
        lambda: enqueue(bad_key, TRIGGER),
        lambda: enqueue(too_long, TRIGGER),
        lambda: enqueue(kind, {**TRIGGER, "x": float("nan")}),
        lambda: enqueue(kind, {**TRIGGER, NAME: {1: PHONE}}),
        lambda: enqueue(kind, {**TRIGGER, "name": NAME + "\x00"}),
        lambda: enqueue(NAME, TRIGGER),
        lambda: enqueue_many(kind, NAME),
        lambda: enqueue(kind, TRIGGER, delay=PHONE),
    ]
    for refuse in refusals:
        with pytest.raises(WorkflowError) as raised:
            refuse()
        seen.append(("exception", "".join(traceback.format_exception(raised.value)) + repr(raised.value)))

    for each in kinds:
        enqueue(each, TRIGGER)
        assert enqueue(each, TRIGGER) is not None  # a duplicate too
    Runner(once=True, kinds=kinds, install_signal_handlers=False).run()
    # The messages are kept where they belong.
    assert DeferredWork.objects.filter(kind__in=kinds, last_error__contains=NAME).exists()

    commands = (
        ["status"],
        ["revive", "--all-abandoned"],
        ["revive", "--kind", kind, "--key", NAME],
        ["rekey", kind],
    )
    for command in commands:
        out = io.StringIO()
        call_command("workflows", *command, stdout=out, stderr=out)
        seen.append((f"workflows {command[0]}", out.getvalue()))

    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.org", "pw"))
    base = "/admin/nexus_workflows/deferredwork/"
    for url in (
        "/admin/",
        base,
        f"{base}?status=attention",
        f"{base}?q={NAME}",
        f"{base}dashboard/",
        "/admin/nexus_workflows/runner/",
        "/internal/metrics",
    ):
        response = client.get(url)
        assert response.status_code == 200, url
        seen.append((url, response.content.decode()))
    seen.append(("find", client.post(f"{base}find/", {"key": NAME}, follow=True).content.decode()))

    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            if table.startswith(("nexus_workflows", "django_admin_log")):
                cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
                columns = [column[0] for column in cursor.description]
                for row in cursor.fetchall():
                    for column, value in zip(columns, row, strict=True):
                        if not (table == DeferredWork._meta.db_table and column in WORK_COLUMNS):
                            seen.append((f"{table}.{column}", str(value)))
    seen.extend(("log", line) for line in every_log.lines)

    assert [(where, leaks(text), text[:300]) for where, text in seen if leaks(text)] == []

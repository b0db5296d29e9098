"""``workflows enqueue KIND -`` and ``workflows revive --kind KIND --key -`` read the trigger
and the dedupe key from standard input: on the command line they are patient data that
every local user sees through ``ps`` (``/proc/<pid>/cmdline``) and that shell history keeps."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from nexus_workflows.models import DeferredWork, Status
from tests.processes import PROJECT_ROOT, url_of_test_database

pytestmark = pytest.mark.django_db

NAME = "Zorbatilde Quixhuatl"
PHONE = "+52 55 8731 4926"


def run(*args: str, stdin: str) -> str:
    out = io.StringIO()
    call_command("workflows", *args, stdout=out, stdin=io.StringIO(stdin))
    return out.getvalue()


@pytest.fixture
def kind(register_workflow: Any) -> str:
    return register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind


def test_enqueue_reads_the_trigger_from_standard_input(kind: str) -> None:
    output = run("enqueue", kind, "-", stdin=f'{{"key": "{PHONE}", "name": "{NAME}"}}\n')
    work = DeferredWork.objects.get()
    assert work.trigger == {"key": PHONE, "name": NAME}
    assert output.strip() == f"enqueued {kind} #{work.pk}"


def test_a_trigger_from_standard_input_that_is_not_json_is_a_command_error(kind: str) -> None:
    with pytest.raises(CommandError, match="TRIGGER-JSON is not valid JSON") as raised:
        run("enqueue", kind, "-", stdin=f"{{name: {NAME}")
    assert NAME not in str(raised.value)
    assert not DeferredWork.objects.exists()


def test_revive_reads_the_dedupe_key_from_the_first_line_of_standard_input(kind: str) -> None:
    other = DeferredWork.objects.create(kind=kind, dedupe_key="other", trigger={}, status=Status.ABANDONED)
    work = DeferredWork.objects.create(kind=kind, dedupe_key=PHONE, trigger={}, status=Status.ABANDONED)

    output = run("revive", "--kind", kind, "--key", "-", stdin=f"{PHONE}\r\nother\n")

    assert output.splitlines() == [f"revived {kind} #{work.pk}", "revived 1, skipped 0"]
    assert DeferredWork.objects.get(pk=work.pk).status == Status.PENDING
    assert DeferredWork.objects.get(pk=other.pk).status == Status.ABANDONED


@pytest.mark.django_db(transaction=True)
def test_a_shell_pipes_the_trigger_into_manage_py() -> None:
    # A real process: the trigger comes through its standard input, never its arguments.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url_of_test_database()}
    trigger = {"key": PHONE, "name": NAME}
    done = subprocess.run(
        [sys.executable, "manage.py", "workflows", "enqueue", "test-noop", "-"],
        cwd=PROJECT_ROOT,
        env=env,
        input=json.dumps(trigger),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    work = DeferredWork.objects.get()
    assert (work.kind, work.trigger) == ("test-noop", trigger)
    assert done.stdout.strip() == f"enqueued test-noop #{work.pk}"


@pytest.mark.parametrize(
    ("stdin", "rule"),
    [(f"{PHONE}\x00\n", "NUL character"), (f"{PHONE}\udcff\n", "not valid Unicode")],
    ids=["nul", "lone-surrogate"],
)
def test_a_dedupe_key_no_work_can_have_is_a_command_error_that_does_not_echo_it(
    kind: str, stdin: str, rule: str
) -> None:
    """No enqueue stores such a key (PostgreSQL cannot even compare with one: it crashed
    with the driver's error and a traceback); the command says what is allowed instead."""
    DeferredWork.objects.create(kind=kind, dedupe_key=PHONE, trigger={}, status=Status.ABANDONED)
    with pytest.raises(CommandError, match=rule) as raised:
        run("revive", "--kind", kind, "--key", "-", stdin=stdin)
    assert "valid Unicode text without NUL characters" in str(raised.value)
    assert PHONE not in str(raised.value)
    assert DeferredWork.objects.get().status == Status.ABANDONED

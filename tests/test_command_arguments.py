"""The management commands' argument errors never quote an argument (it may be a trigger, a
dedupe key: patient data), whether the command runs from the command line (argparse prints
the error on standard error) or through ``call_command`` (in a ``CommandError``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from nexus_workflows.management.commands._arguments import NOT_PARSED, without_values
from nexus_workflows.models import DeferredWork
from tests.processes import PROJECT_ROOT, url_of_test_database

NAME = "Zorbatilde Quixhuatl"
PHONE = "+52 55 8731 4926"
# A JSON trigger left unquoted in a shell: one argument per word.
UNQUOTED = ["{name:", "Zorbatilde", "Quixhuatl,", "phone:", "+52", "55", "8731", "4926}"]


@pytest.mark.parametrize(
    ("message", "instead"),
    [
        (
            f"unrecognized arguments: {PHONE} {NAME}",
            "unrecognized arguments (not shown: they may be patient data)",
        ),
        (
            f"argument SUBCOMMAND: invalid choice: '{NAME}' (choose from 'enqueue', 'status')",
            "argument SUBCOMMAND: invalid choice (choose from 'enqueue', 'status')",
        ),
        (  # the value holds the marker: the last one, argparse's own, is the list
            f"argument SUBCOMMAND: invalid choice: 'Zorbatilde (choose from {NAME}' (choose from enqueue)",
            "argument SUBCOMMAND: invalid choice (choose from enqueue)",
        ),
        (
            f"argument --reveal: ignored explicit argument '{NAME}'",
            "argument --reveal: not accepted as given (not shown: it may be patient data)",
        ),
        (
            f"argument --delay: invalid float value: '{PHONE}'",
            "argument --delay: not accepted as given (not shown: it may be patient data)",
        ),
        (
            f"ambiguous option: --k={NAME} could match Quixhuatl could match --kind, --key",
            NOT_PARSED,
        ),
        # A wording not known here (another Python's, another locale's): fails closed.
        (
            f"argumento no válido: '{NAME}'",
            NOT_PARSED,
        ),
        # Messages that quote nothing given are kept whole.
        ("the following arguments are required: KIND, TRIGGER-JSON", None),
        ("argument --delay: must be a number", None),
        ("argument --kind: expected one argument", None),
        (
            "argument -v/--verbosity: invalid choice: '7' (choose from 0, 1, 2, 3)",
            "argument -v/--verbosity: invalid choice (choose from 0, 1, 2, 3)",
        ),
    ],
)
def test_argparse_messages_lose_what_they_quoted_of_the_arguments(message: str, instead: str | None) -> None:
    assert without_values(message) == (instead or message)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("command", "arguments", "said"),
    [
        ("workflows", ["enqueue", "test-noop", *UNQUOTED], "unrecognized arguments (not shown"),
        # A value given to a flag that takes none, Django's flags and ours, in every form.
        ("workflows", ["status", f"--reveal={NAME}"], "argument --reveal: not accepted as given"),
        ("workflows", ["enqueue", "test-noop", "{}", f"--rev={NAME}"], "argument --reveal: not accepted"),
        ("workflows", [f"--traceback={NAME}", "status"], "argument --traceback: not accepted as given"),
        ("runworkflows", [f"--once={PHONE}"], "argument --once: not accepted as given"),
        ("workflows", ["revive", f"--k={NAME} could match x"], "the arguments do not parse (not shown"),
        ("workflows", [f"x (choose from {NAME}"], "SUBCOMMAND: invalid choice (choose from "),
        ("workflows", [NAME], "SUBCOMMAND: invalid choice (choose from "),
        # A stray word among revive's ids: refused as an id, not quoted.
        ("workflows", ["revive", "--kind", "test-noop", "--key", PHONE, NAME], "argument ID: must be the id"),
        ("runworkflows", ["--once", NAME], "unrecognized arguments (not shown"),
        ("rotate_phi_keys", [PHONE], "unrecognized arguments (not shown"),
    ],
)
def test_call_command_errors_do_not_quote_the_arguments(
    command: str, arguments: list[str], said: str
) -> None:
    with pytest.raises(CommandError) as raised:
        call_command(command, *arguments)
    message = str(raised.value)
    assert said in message
    assert "Zorbatilde" not in message
    assert "8731" not in message
    assert not DeferredWork.objects.exists()


@pytest.mark.django_db
def test_a_trigger_left_unquoted_on_the_command_line_is_not_printed() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": url_of_test_database()}
    done = subprocess.run(
        [sys.executable, "manage.py", "workflows", "enqueue", "test-noop", *UNQUOTED],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2  # argparse's: the arguments do not parse
    assert "unrecognized arguments (not shown: they may be patient data)" in done.stderr
    assert "usage: manage.py workflows" in done.stderr
    assert "Zorbatilde" not in done.stderr + done.stdout
    assert "8731" not in done.stderr + done.stdout
    assert not DeferredWork.objects.exists()

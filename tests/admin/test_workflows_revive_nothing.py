"""``workflows revive`` that revives nothing still exits 0 (cron-driven use: finding nothing
is not a failure), and its last line says "nothing to revive"; the help names the exit
statuses."""

from __future__ import annotations

import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command

from nexus_workflows.management.commands.workflows import Command
from nexus_workflows.models import Status
from tests.conftest import REPOSITORY

pytestmark = pytest.mark.django_db


def revive(*args: str) -> list[str]:
    out = StringIO()
    call_command("workflows", "revive", *args, stdout=out, stderr=StringIO())
    return out.getvalue().splitlines()


def test_all_abandoned_with_none_says_nothing_to_revive(make_work, workflow):
    make_work(Status.PENDING)

    assert revive("--all-abandoned") == ["no abandoned work", "revived 0, skipped 0: nothing to revive"]
    assert revive("--all-abandoned", "--kind", workflow.kind) == [
        f"no abandoned work of kind {workflow.kind!r}",
        "revived 0, skipped 0: nothing to revive",
    ]


def test_ids_that_are_all_skipped_say_nothing_to_revive(make_work, workflow):
    done = make_work(Status.DONE)

    assert revive(str(done.pk)) == [
        f"skipped {workflow.kind} #{done.pk}: done, not abandoned",
        "revived 0, skipped 1: nothing to revive",
    ]


def test_a_revive_that_revives_something_does_not_say_nothing(make_work):
    make_work(Status.ABANDONED)

    assert revive("--all-abandoned")[-1] == "revived 1, skipped 0"


@pytest.mark.django_db(transaction=True)
def test_nothing_to_revive_exits_0(child_env):
    # A real process: its exit status is what cron sees.
    done = subprocess.run(
        [sys.executable, "manage.py", "workflows", "revive", "--all-abandoned"],
        cwd=REPOSITORY,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert (done.returncode, done.stdout.splitlines()[-1]) == (0, "revived 0, skipped 0: nothing to revive")


def test_the_help_names_the_exit_statuses():
    parser = Command().create_parser("manage.py", "workflows")
    (subcommands,) = (action for action in parser._actions if action.dest == "subcommand")
    help_text = " ".join(subcommands.choices["revive"].format_help().split())

    assert "Exit status: 0 when the revive ran, whether it revived anything or not" in help_text
    assert "1 when the request was refused" in help_text
    assert "2 when the arguments do not parse" in help_text

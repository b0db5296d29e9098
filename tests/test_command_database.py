"""The commands before they touch the database: one line, not a traceback, when it does
not answer or lacks the app's migrations; a runner refuses tables it cannot use instead of
logging the same error type forever."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from nexus_workflows.management.commands._database import MigrationsMissing, require_migrated
from tests.ports import refusing_port
from tests.processes import ManagePy


def latest_migration() -> str:
    """The app's last migration (the graph's leaf), whatever its number."""
    from django.db.migrations.loader import MigrationLoader

    (leaf,) = MigrationLoader(None, ignore_no_migrations=True).graph.leaf_nodes("nexus_workflows")
    return leaf[1]


LATEST = latest_migration()
KIND = "test-command-database"


@pytest.fixture
def latest_migration_unapplied() -> Iterator[None]:
    """The database as code one release ahead of it finds it: its last migration not applied."""
    recorder = MigrationRecorder(connection)
    recorder.record_unapplied("nexus_workflows", LATEST)
    try:
        yield
    finally:
        recorder.record_applied("nexus_workflows", LATEST)


@pytest.mark.django_db
def test_a_migrated_database_passes() -> None:
    require_migrated("default")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "args",
    [
        ["workflows", "status"],
        ["workflows", "enqueue", KIND, '{"key": "a"}'],
        ["workflows", "revive", "--all-abandoned"],
        ["runworkflows", "--once"],
        ["rotate_phi_keys"],
    ],
)
def test_commands_refuse_a_database_without_the_apps_migrations(
    latest_migration_unapplied: None, register_workflow: Any, args: list[str]
) -> None:
    register_workflow(lambda t, c, s: None, kind=KIND, retry_schedule=[1])
    with pytest.raises(MigrationsMissing) as raised:
        call_command(*args)
    assert f"lacks 1 migration(s) of nexus_workflows ({LATEST}): run `manage.py migrate` first" in str(
        raised.value
    )


@pytest.mark.django_db(transaction=True)
def test_tables_made_without_migrations_pass() -> None:
    """A project's test database made from the models (TEST MIGRATE False) records no
    migration of the app; its tests may still run the commands."""
    recorder = MigrationRecorder(connection)
    names = sorted(name for app, name in recorder.applied_migrations() if app == "nexus_workflows")
    for name in names:
        recorder.record_unapplied("nexus_workflows", name)
    try:
        require_migrated("default")
        call_command("runworkflows", "--once")
    finally:
        for name in names:
            recorder.record_applied("nexus_workflows", name)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_long_running_runner_refuses_a_database_without_the_apps_migrations(
    latest_migration_unapplied: None,
) -> None:
    """It started and logged "runner loop error (ProgrammingError)", or on SQLite "database
    unavailable (OperationalError)", every few seconds, never naming the cause."""
    process = ManagePy("runworkflows")
    try:
        assert process.wait(timeout=60) == 1
        output = process.output()
    finally:
        process.close()
    assert "MigrationsMissing: the database 'default'" in output
    assert LATEST in output
    assert "Traceback" not in output


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["workflows", "status"],
        ["workflows", "revive", "--all-abandoned"],
        ["rotate_phi_keys"],
        # It waited for the database forever (and, stopped, printed a summary and exited 0).
        ["runworkflows", "--once"],
    ],
)
def test_an_unreachable_database_is_one_line_not_a_traceback(args: list[str]) -> None:
    with refusing_port() as port:
        process = ManagePy(*args, database_url=f"postgres://nobody@127.0.0.1:{port}/nx_nowhere")
        try:
            assert process.wait(timeout=60) == 1
            output = process.output()
        finally:
            process.close()
    assert (
        f"DatabaseUnreachable: cannot reach the database 'default' (postgresql nx_nowhere on "
        f"127.0.0.1:{port}): OperationalError." in output
    ), output
    assert "Traceback" not in output

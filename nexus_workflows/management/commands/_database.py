"""What the commands need of the database before they touch it: reachable, and with every
migration of the app applied. Either failure is one line naming the database (never its
credentials) and what to do, instead of a traceback, or a runner that starts and then
logs the same error type forever. Django lists no command for a module whose name starts
with an underscore."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import connections
from django.db.migrations.executor import MigrationExecutor

from nexus_workflows.deferred.runner.unavailable import DATABASE_UNAVAILABLE
from nexus_workflows.observability.logs import describe_database

APP_LABEL = "nexus_workflows"


class DatabaseUnreachable(CommandError):
    """The database did not answer: nothing of the command was done."""


class MigrationsMissing(CommandError):
    """The database lacks migrations of the app: its tables are missing or out of date."""


def require_migrated(using: str) -> None:
    """Raise :class:`DatabaseUnreachable` or :class:`MigrationsMissing` unless database
    ``using`` answers and has every migration of the app this code ships applied."""
    where = describe_database(using)
    try:
        executor = MigrationExecutor(connections[using])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes(APP_LABEL))
    except DATABASE_UNAVAILABLE as error:
        # The type only: the driver's text may quote a statement.
        raise DatabaseUnreachable(
            f"cannot reach the database {using!r} ({where}): {type(error).__name__}. "
            "Check that it is running and that DATABASES points at it."
        ) from error
    missing = [migration.name for migration, backwards in plan if migration.app_label == APP_LABEL]
    if missing and _made_without_migrations(executor, using):
        return
    if missing:
        raise MigrationsMissing(
            f"the database {using!r} ({where}) lacks {len(missing)} migration(s) of {APP_LABEL} "
            f"({', '.join(missing)}): run `manage.py migrate` first."
        )


def _made_without_migrations(executor: MigrationExecutor, using: str) -> bool:
    """The app's tables exist but none of its migrations is recorded: a test database made
    from the models (``TEST: {"MIGRATE": False}``), which a project's tests may run
    commands on."""
    from nexus_workflows.models import DeferredWork

    if any(app_label == APP_LABEL for app_label, name in executor.loader.applied_migrations):
        return False
    return DeferredWork._meta.db_table in connections[using].introspection.table_names()

"""Migration 0013 (MySQL/MariaDB): its reverse refuses, before changing anything, when two
stored values would become one under the server's default collation."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.exceptions import IrreversibleError
from django.db.migrations.executor import MigrationExecutor

from nexus_workflows.models import DeferredWork

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True)]

BEFORE_0013 = ("nexus_workflows", "0012_no_notify_for_no_rows")
APPLIED_0013 = ("nexus_workflows", "0013_mysql_exact_text")


def _collations() -> set[str]:
    """The collations of the app's text columns."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME LIKE 'nexus\\_workflows\\_%%' "
            "AND COLLATION_NAME IS NOT NULL"
        )
        return {name for (name,) in cursor.fetchall()}


def test_going_back_before_0013_refuses_keys_that_would_become_one_and_names_no_key() -> None:
    """ "maria" and "María" are two dedupe keys (two patients) under 0013's exact collation
    and one under the server's default: the reverse used to fail half-way with the server's
    duplicate-key error, which quotes the key (patient data, into a deploy's log)."""
    for key in ("maria", "María"):
        DeferredWork.objects.create(kind="k", dedupe_key=key, trigger={})
    executor = MigrationExecutor(connection)
    try:
        with pytest.raises(IrreversibleError) as refused:
            executor.migrate([BEFORE_0013])
        message = str(refused.value)
        assert "nexus_workflows_deferredwork" in message
        assert "dedupe_key" in message
        assert "maria" not in message.lower()
        assert _collations() == {"utf8mb4_nopad_bin"}  # no table went back
        assert APPLIED_0013 in MigrationExecutor(connection).loader.applied_migrations
    finally:
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert set(DeferredWork.objects.values_list("dedupe_key", flat=True)) == {"maria", "María"}

# PostgreSQL only: the work table's trigger sends its NOTIFY only while some runner waits
# for one (issue 12, item 4). A waiting runner holds the advisory lock (1853320038, 1)
# shared on its LISTEN session (nexus_workflows.sql.postgresql.WAITING_LOCK); the trigger
# tries to take it exclusively for the rest of its transaction:
#
# * it gets it: no runner waits, so no NOTIFY (a busy runner claims again by itself); and
#   no runner can start waiting until this transaction has ended, because the shared lock
#   waits for it, and the runner claims once more after it got the lock: it sees the rows;
# * it does not (a runner waits, or another enqueue holds it for the moment): NOTIFY as
#   before, with "<id> <kind>" for one row.
#
# The lock lives in memory (no WAL, no table), and dies with the session that held it: a
# runner killed while waiting leaves nothing behind.

from collections.abc import Callable
from importlib import import_module
from typing import Any

from django.db import migrations

NOTIFY_WHILE_WAITING = """
CREATE OR REPLACE FUNCTION nexus_workflows_notify_new_work() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    IF pg_try_advisory_xact_lock(1853320038, 1) THEN
        RETURN NULL;
    END IF;
    SELECT CASE WHEN count(*) = 1 THEN min(id)::text || ' ' || min(kind) ELSE '' END
    INTO payload FROM inserted;
    PERFORM pg_notify('nexus_workflows', payload);
    RETURN NULL;
END
$$
"""

# Reversed: the function as migration 0009 wrote it (a NOTIFY for every INSERT).
NOTIFY_ALWAYS = import_module("nexus_workflows.migrations.0009_notify_new_work_id").NOTIFY_FUNCTION_WITH_ID


def _replace_function(definition: str) -> Callable[[Any, Any], None]:
    def replace(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(definition)  # the trigger itself stays (migration 0009)

    return replace


class Migration(migrations.Migration):
    dependencies = [
        ("nexus_workflows", "0010_expiry_index_finished_rows_only"),
    ]

    operations = [
        migrations.RunPython(
            _replace_function(NOTIFY_WHILE_WAITING), _replace_function(NOTIFY_ALWAYS)
        ),
    ]

# MariaDB's claims read nw_due_idx in order and filtered each entry by kind and task queue, so
# due rows of kinds and queues no runner takes (a workflow removed from the code, a queue
# nobody runs) ahead of the real work were walked past on every claim (200,000 such rows: a
# read of 43 ms instead of 0.7 ms). PostgreSQL got its per-kind and per-queue indexes in 0016;
# MariaDB has neither partial nor expression indexes, so Django built nothing there. This
# builds MariaDB's own (sql/mysql.py, DUE_INDEXES), online (ALGORITHM=INPLACE, LOCK=NONE; its
# metadata lock waited for at most DDL_LOCK_WAIT), and is a no-op elsewhere. Outside the model state: no model Index would be built on MariaDB
# alone (a plain one would be built on SQLite and PostgreSQL too, duplicating 0016's there).

from typing import Any

from django.db import migrations

from nexus_workflows.sql import mysql


def _table(apps: Any) -> str:
    return str(apps.get_model("nexus_workflows", "DeferredWork")._meta.db_table)


def _forwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        mysql.add_due_indexes(schema_editor, _table(apps))


def _backwards(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "mysql":
        mysql.drop_due_indexes(schema_editor, _table(apps))


class Migration(migrations.Migration):
    atomic = False  # MariaDB commits DDL anyway; each statement is re-runnable (IF [NOT] EXISTS)
    dependencies = [
        ("nexus_workflows", "0017_notify_resting_limited_kinds"),
    ]

    operations = [
        migrations.RunPython(_forwards, _backwards),
    ]

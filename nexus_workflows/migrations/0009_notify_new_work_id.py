# PostgreSQL only: the NOTIFY of an INSERT of one row carries that row's id and kind
# ("<id> <kind>"), so an idle runner of that kind claims it by id in one statement (issue
# 12); an INSERT of many rows (or none: a dedupe conflict) sends an empty payload, as
# before, and runners run their ordinary claim. No trigger data but the id and the kind
# (a registered workflow kind or a task's import path) ever leaves the table.

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

NOTIFY_FUNCTION_WITH_ID = """
CREATE OR REPLACE FUNCTION nexus_workflows_notify_new_work() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    SELECT CASE WHEN count(*) = 1 THEN min(id)::text || ' ' || min(kind) ELSE '' END
    INTO payload FROM inserted;
    PERFORM pg_notify('nexus_workflows', payload);
    RETURN NULL;
END
$$
"""

NOTIFY_FUNCTION_EMPTY = """
CREATE OR REPLACE FUNCTION nexus_workflows_notify_new_work() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('nexus_workflows', '');
    RETURN NULL;
END
$$
"""


def _trigger(apps: Apps, schema_editor: BaseDatabaseSchemaEditor, *, with_id: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("nexus_workflows", "DeferredWork")._meta.db_table)
    schema_editor.execute(f"DROP TRIGGER IF EXISTS nexus_workflows_new_work ON {table}")
    schema_editor.execute(NOTIFY_FUNCTION_WITH_ID if with_id else NOTIFY_FUNCTION_EMPTY)
    # A statement trigger still (one notification per INSERT statement, however many
    # rows), now with the statement's new rows as a transition table.
    referencing = "REFERENCING NEW TABLE AS inserted " if with_id else ""
    schema_editor.execute(
        f"CREATE TRIGGER nexus_workflows_new_work AFTER INSERT ON {table} {referencing}"
        "FOR EACH STATEMENT EXECUTE FUNCTION nexus_workflows_notify_new_work()"
    )


def notify_with_id(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _trigger(apps, schema_editor, with_id=True)


def notify_empty(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _trigger(apps, schema_editor, with_id=False)


class Migration(migrations.Migration):
    dependencies = [
        ("nexus_workflows", "0008_tasks"),
    ]

    operations = [
        migrations.RunPython(notify_with_id, notify_empty),
    ]

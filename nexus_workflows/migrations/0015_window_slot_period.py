# Each rate-window row keeps the period its last start was taken under, so a window whose
# period a deploy lengthened can tell which earlier starts may still count (flow.windows).
#
# A nullable column without a default: on PostgreSQL a change of the catalog only (no
# rewrite, no scan, whatever the table's size), on MariaDB an instant ADD COLUMN, on SQLite
# an ALTER TABLE ADD COLUMN. PostgreSQL still needs a moment's ACCESS EXCLUSIVE lock, and
# waiting for it behind a long transaction on the table would hold every write queued behind
# it: lock_timeout bounds that wait to 5 s, after which the migration fails and is run again.
# Rows stamped before it have no period and are taken as stamped under the current one.

from typing import Any

from django.db import migrations, models


def _bound_lock_wait(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("SET LOCAL lock_timeout = '5s'")


class Migration(migrations.Migration):
    dependencies = [
        ("nexus_workflows", "0014_due_index_status_first"),
    ]

    operations = [
        migrations.RunPython(_bound_lock_wait, migrations.RunPython.noop, elidable=True),
        migrations.AddField(model_name="flowwindowslot", name="period", field=models.FloatField(null=True)),
    ]

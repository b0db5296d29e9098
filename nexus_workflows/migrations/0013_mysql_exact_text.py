# MySQL and MariaDB only: every table of the app compares text exactly, as PostgreSQL and
# SQLite do, by a binary NO PAD collation. The server's default (utf8mb4_general_ci on
# MariaDB) takes "maria", "María", "MARIA" and "maria " for one value: one dedupe key (the
# later patients' work deduplicated into the first's, never run), one kind, one rate window.
# Converting to a finer collation never makes two stored values equal, so no row can clash.
# It rebuilds each table once. A table a later migration creates needs the same
# (tests/test_enqueueing.py checks every table of the app).

from typing import Any

from django.db import migrations

EXACT = {"mariadb": "utf8mb4_nopad_bin", "mysql": "utf8mb4_0900_bin"}


def _tables(apps: Any) -> list[str]:
    return [model._meta.db_table for model in apps.get_app_config("nexus_workflows").get_models()]


def compare_exactly(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = EXACT["mariadb" if connection.mysql_is_mariadb else "mysql"]
    for table in _tables(apps):
        table = schema_editor.quote_name(table)
        schema_editor.execute(f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}")


def compare_by_the_default(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "mysql":
        return
    for table in _tables(apps):  # utf8mb4's default collation
        table = schema_editor.quote_name(table)
        schema_editor.execute(f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4")


class Migration(migrations.Migration):
    atomic = False  # DDL on MySQL commits at once: Django refuses it inside a transaction

    dependencies = [
        ("nexus_workflows", "0012_no_notify_for_no_rows"),
    ]

    operations = [
        migrations.RunPython(compare_exactly, compare_by_the_default),
    ]

# MySQL and MariaDB only: every table of the app compares text exactly, as PostgreSQL and
# SQLite do, by a binary NO PAD collation. The server's default (utf8mb4_general_ci on
# MariaDB) takes "maria", "María", "MARIA" and "maria " for one value: one dedupe key (the
# later patients' work deduplicated into the first's, never run), one kind, one rate window.
# Converting to a finer collation never makes two stored values equal, so no row can clash.
# It rebuilds each table once. A table a later migration creates needs the same
# (tests/test_enqueueing.py checks every table of the app).

from typing import Any

from django.db import migrations
from django.db.migrations.exceptions import IrreversibleError

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
    # Back to the default collation, two stored values may become one (a dedupe key
    # "maria" beside "María"): refuse before any table is changed, naming the table and
    # its columns, never a value (the server's duplicate-key error quotes the value).
    for model in apps.get_app_config("nexus_workflows").get_models():
        for fields in _unique_text_fields(model):
            if _clash(schema_editor, model, fields):
                raise IrreversibleError(
                    f"{model._meta.db_table}: rows whose {', '.join(fields)} differ only by case, "
                    "accents or trailing spaces would be one value under the server's default "
                    "collation, which this reverse migration goes back to; delete or change one "
                    "of each such pair first. Nothing was changed."
                )
    for table in _tables(apps):  # utf8mb4's default collation
        table = schema_editor.quote_name(table)
        schema_editor.execute(f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4")


def _unique_text_fields(model: Any) -> list[tuple[str, ...]]:
    """The column names of each unique field or constraint of ``model`` holding text."""
    uniques = [(field,) for field in model._meta.local_fields if field.unique and not field.primary_key]
    uniques += [
        tuple(model._meta.get_field(name) for name in constraint.fields)
        for constraint in model._meta.total_unique_constraints
    ]
    uniques += [tuple(model._meta.get_field(name) for name in names) for names in model._meta.unique_together]
    return [
        tuple(field.column for field in fields)
        for fields in uniques
        if any(field.get_internal_type() in ("CharField", "TextField", "SlugField") for field in fields)
    ]


def _clash(schema_editor: Any, model: Any, columns: tuple[str, ...]) -> bool:
    """Whether two rows' ``columns`` are one value under the server's default collation
    for utf8mb4 (the one ``CONVERT TO CHARACTER SET utf8mb4`` gives)."""
    quote = schema_editor.quote_name
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT DEFAULT_COLLATE_NAME FROM information_schema.CHARACTER_SETS "
            "WHERE CHARACTER_SET_NAME = 'utf8mb4'"
        )
        (default,) = cursor.fetchone()
        grouped = ", ".join(f"{quote(column)} COLLATE {default}" for column in columns)
        cursor.execute(
            f"SELECT 1 FROM {quote(model._meta.db_table)} GROUP BY {grouped} HAVING COUNT(*) > 1 LIMIT 1"
        )
        return cursor.fetchone() is not None


class Migration(migrations.Migration):
    atomic = False  # DDL on MySQL commits at once: Django refuses it inside a transaction

    dependencies = [
        ("nexus_workflows", "0012_no_notify_for_no_rows"),
    ]

    operations = [
        migrations.RunPython(compare_exactly, compare_by_the_default),
    ]

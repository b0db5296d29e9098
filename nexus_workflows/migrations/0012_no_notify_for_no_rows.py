# PostgreSQL only: the work table's statement trigger does nothing for an INSERT that
# inserted no row. enqueue's one-row INSERT skips a taken dedupe key (ON CONFLICT DO
# NOTHING) rather than failing on it, so that the server never logs the failed statement
# with its values (the trigger, the key: patient data). A statement trigger still fires for
# that INSERT; without this check it would wake every waiting runner for nothing (an empty
# NOTIFY), or else take the waiting lock for the rest of the caller's transaction. The
# same now holds for an enqueue_many whose keys were all taken.

from importlib import import_module

from django.db import migrations

NOTIFY_NEW_ROWS_WHILE_WAITING = """
CREATE OR REPLACE FUNCTION nexus_workflows_notify_new_work() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    IF NOT EXISTS (SELECT FROM inserted) THEN
        RETURN NULL;
    END IF;
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

_0011 = import_module("nexus_workflows.migrations.0011_notify_only_waiting_runners")


class Migration(migrations.Migration):
    dependencies = [
        ("nexus_workflows", "0011_notify_only_waiting_runners"),
    ]

    operations = [
        migrations.RunPython(
            _0011._replace_function(NOTIFY_NEW_ROWS_WHILE_WAITING),
            _0011._replace_function(_0011.NOTIFY_WHILE_WAITING),
        ),
    ]

# PostgreSQL only: an attempt of a limited kind that ends (its row leaves "processing"
# holding a concurrency slot or a serial key) sends a NOTIFY "<id> <kind>" while some
# runner rests that kind until an attempt of it ends. Until now a runner learned of a slot
# freed by ANOTHER runner only by its rest's bound (flow.claiming._REST, 0.2 s).
#
# Gated like the INSERT trigger (migrations 0011, 0017): a runner resting a kind whose
# slots are all held holds, shared on its LISTEN session, the advisory lock (1853320040,
# hashtext(kind)) (nexus_workflows.sql.postgresql.ENDING_LOCK_CLASS); the row trigger
# tries to take it for the rest of its transaction. It gets it: no runner waits for that
# kind's attempts, no NOTIFY, and no runner can begin such a rest before this transaction
# ends (the shared lock waits for it; the runner then asks the kind once more). It does
# not: NOTIFY. The trigger's WHEN keeps every other UPDATE (heartbeats, claims, rows of
# unlimited kinds) from calling the function at all; no statement is added anywhere. Two
# ends of a kind at once: the second cannot take the lock the first holds, and notifies
# though nobody may rest the kind (a spurious wake-up, as between enqueues in 0011).
#
# CREATE TRIGGER takes a SHARE ROW EXCLUSIVE lock on the work table (DROP TRIGGER, the
# reverse, an ACCESS EXCLUSIVE one): queued behind a transaction that wrote the table, it
# would hold every later enqueue, claim and heartbeat behind it. lock_timeout bounds that
# wait to LOCK_WAIT, after which the migration fails, nothing written, and is run again
# (as 0015). Re-runnable: CREATE OR REPLACE (PostgreSQL 14+, as Django 5.2 needs), which
# takes no stronger lock than CREATE.

from typing import Any

from django.db import migrations

ENDED_FUNCTION = """
CREATE OR REPLACE FUNCTION nexus_workflows_notify_attempt_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(1853320040, hashtext(NEW.kind)) THEN
        PERFORM pg_notify('nexus_workflows', NEW.id::text || ' ' || NEW.kind);
    END IF;
    RETURN NULL;
END
$$
"""


#: How long the migration waits for its lock on the work table (either way).
LOCK_WAIT = "5s"


def _table(apps: Any, schema_editor: Any) -> str:
    return str(schema_editor.quote_name(apps.get_model("nexus_workflows", "DeferredWork")._meta.db_table))


def add_trigger(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = _table(apps, schema_editor)
    schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
    schema_editor.execute(ENDED_FUNCTION)
    schema_editor.execute(
        f"CREATE OR REPLACE TRIGGER nexus_workflows_attempt_ended AFTER UPDATE ON {table} FOR EACH ROW "
        "WHEN (OLD.status = 'processing' AND NEW.status <> 'processing' "
        "AND (OLD.flow_slot IS NOT NULL OR OLD.serial_key_hash IS NOT NULL)) "
        "EXECUTE FUNCTION nexus_workflows_notify_attempt_ended()"
    )


def drop_trigger(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = _table(apps, schema_editor)
    schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
    schema_editor.execute(f"DROP TRIGGER IF EXISTS nexus_workflows_attempt_ended ON {table}")
    schema_editor.execute("DROP FUNCTION IF EXISTS nexus_workflows_notify_attempt_ended()")


class Migration(migrations.Migration):
    dependencies = [
        ("nexus_workflows", "0018_mariadb_due_per_kind_and_queue"),
    ]

    operations = [
        migrations.RunPython(add_trigger, drop_trigger),
    ]

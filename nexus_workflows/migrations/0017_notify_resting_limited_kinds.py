# PostgreSQL only: the work table's trigger also sends its NOTIFY when a busy runner rests a
# kind of the rows inserted. Until now an enqueue of a kind with flow limits sent a NOTIFY
# of its own every time (one statement more, and the NOTIFY's share of its commit), so that
# a busy runner, which holds no waiting lock and asks a limited kind only now and then,
# heard of it. Now a runner holds, shared on its LISTEN session, the advisory lock
# (1853320039, hashtext(kind)) of each limited kind it rests (nexus_workflows.sql.postgresql
# .REST_LOCK_CLASS), and the trigger tries to take the lock of each kind it inserted for the
# rest of its transaction, as it does the waiting lock (migration 0011):
#
# * it gets them all: no runner waits and none rests these kinds, so no NOTIFY (a runner
#   that is not resting a kind asks it every turn); and no runner can start resting one of
#   them until this transaction has ended, because the shared lock waits for it, and the
#   runner asks the kind once more after it got the lock: it sees the rows;
# * it does not: NOTIFY as before ("<id> <kind>" for one row, "" for several).
#
# A function replaced, no table touched: nothing waits for it and it waits for nothing.

from importlib import import_module

from django.db import migrations

NOTIFY_WAITING_OR_RESTING = """
CREATE OR REPLACE FUNCTION nexus_workflows_notify_new_work() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    payload text;
BEGIN
    IF NOT EXISTS (SELECT FROM inserted) THEN
        RETURN NULL;
    END IF;
    IF pg_try_advisory_xact_lock(1853320038, 1) AND NOT EXISTS (
        SELECT FROM (SELECT DISTINCT kind FROM inserted) AS new_kinds
        WHERE NOT pg_try_advisory_xact_lock(1853320039, hashtext(new_kinds.kind))
    ) THEN
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
_0012 = import_module("nexus_workflows.migrations.0012_no_notify_for_no_rows")


class Migration(migrations.Migration):
    dependencies = [
        ("nexus_workflows", "0016_due_per_kind_and_queue"),
    ]

    operations = [
        migrations.RunPython(
            _0011._replace_function(NOTIFY_WAITING_OR_RESTING),
            _0011._replace_function(_0012.NOTIFY_NEW_ROWS_WHILE_WAITING),
        ),
    ]

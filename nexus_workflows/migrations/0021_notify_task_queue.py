# PostgreSQL only: the NOTIFY of a Django task's row inserted alone names its queue too,
# "<id> <task path> <queue>" (a workflow's row stays "<id> <kind>": its queue_name is
# empty). A runner that takes only some task queues (runworkflows --queue) ignored nothing
# before: every task enqueued for any queue woke it into a claim by id that its queue
# re-check turned down, one wasted UPDATE per task enqueued while it waited. A task path
# holds no space (a workflow kind neither: registry.KIND_PATTERN), so the queue is what
# follows the second space, whatever it holds. Runners of earlier releases read the
# payload's last two words as the kind: it has a dot, so they claim it as a task by id,
# queue re-checked, as before.
#
# A function replaced, no table touched: nothing waits for it and it waits for nothing.

from importlib import import_module

from django.db import migrations

NOTIFY_NAMING_TASK_QUEUE = """
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
    SELECT CASE WHEN count(*) <> 1 THEN ''
                WHEN min(queue_name) = '' THEN min(id)::text || ' ' || min(kind)
                ELSE min(id)::text || ' ' || min(kind) || ' ' || min(queue_name) END
    INTO payload FROM inserted;
    PERFORM pg_notify('nexus_workflows', payload);
    RETURN NULL;
END
$$
"""

_0011 = import_module("nexus_workflows.migrations.0011_notify_only_waiting_runners")
_0017 = import_module("nexus_workflows.migrations.0017_notify_resting_limited_kinds")


class Migration(migrations.Migration):
    dependencies = [
        ("nexus_workflows", "0020_notify_ended_kind_once"),
    ]

    operations = [
        migrations.RunPython(
            _0011._replace_function(NOTIFY_NAMING_TASK_QUEUE),
            _0011._replace_function(_0017.NOTIFY_WAITING_OR_RESTING),
        ),
    ]

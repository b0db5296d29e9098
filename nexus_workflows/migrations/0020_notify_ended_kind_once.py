# PostgreSQL only: the NOTIFY an ended attempt of a limited kind sends (migration 0019)
# names the kind, "ended <kind>", no longer the row ("<id> <kind>"). No runner used the id
# (a limited kind is never claimed by id: the wake-up only ends the kind's rest), and a
# payload that is the same for every row of the kind lets PostgreSQL merge the
# notifications of one transaction (identical channel and payload are delivered once): an
# UPDATE that ends or releases N rows of a rested kind now sends one NOTIFY per kind, not
# N. The trigger stays per row (a statement trigger cannot have 0019's WHEN, so every
# claim and heartbeat would call it and fill its transition tables); pg_notify still runs
# once per such row, but a repeat costs a lookup in the transaction's pending list.
#
# Runners before this migration read "ended <kind>" as a payload naming no row: they end
# the rest of every limited kind and claim once (a wider wake-up; nothing is lost).
#
# A function replaced, no table touched: nothing waits for it and it waits for nothing.

from importlib import import_module
from typing import Any

from django.db import migrations

ENDED_KIND_FUNCTION = """
CREATE OR REPLACE FUNCTION nexus_workflows_notify_attempt_ended() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(1853320040, hashtext(NEW.kind)) THEN
        PERFORM pg_notify('nexus_workflows', 'ended ' || NEW.kind);
    END IF;
    RETURN NULL;
END
$$
"""

_0019 = import_module("nexus_workflows.migrations.0019_notify_attempt_ended_while_full")


def _replace_function(definition: str) -> Any:
    def replace(apps: Any, schema_editor: Any) -> None:
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(definition)  # the trigger itself stays (migration 0019)

    return replace


class Migration(migrations.Migration):
    dependencies = [
        ("nexus_workflows", "0019_notify_attempt_ended_while_full"),
    ]

    operations = [
        migrations.RunPython(
            _replace_function(ENDED_KIND_FUNCTION), _replace_function(_0019.ENDED_FUNCTION)
        ),
    ]

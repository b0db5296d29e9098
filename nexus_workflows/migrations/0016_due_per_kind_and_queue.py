# A claim read nw_due_idx in order and filtered each entry by kind (and a task's queue):
# due rows of a kind no runner here takes (a workflow removed from the code, a task whose
# queue nobody runs) ahead of the real work were walked past on every claim (200,000 such
# rows: 32-54 ms a claim instead of ~1 ms). These two indexes keep the due order per kind
# and per task queue, so a claim on PostgreSQL reads only the kinds and queues it takes
# (sql/postgresql.py, due_ids). The priority is negated, an expression: nw_due_idx cannot
# give that order, so the planner never reads it filtered by kind instead.
#
# Built CONCURRENTLY on PostgreSQL, like 0014: writes go on while they build. MariaDB has no
# expression indexes: Django creates neither there (its claim reads nw_due_idx as before).

from django.db import migrations, models
from django.db.models import F

from nexus_workflows.index_operations import AddIndexWithoutBlocking


class Migration(migrations.Migration):
    atomic = False  # concurrent index builds on PostgreSQL
    dependencies = [
        ("nexus_workflows", "0015_window_slot_period"),
    ]

    operations = [
        AddIndexWithoutBlocking(
            model_name="deferredwork",
            index=models.Index(
                F("kind"),
                -F("priority"),
                F("next_attempt_at"),
                condition=models.Q(("status", "pending")),
                name="nw_due_kind_idx",
            ),
        ),
        AddIndexWithoutBlocking(
            model_name="deferredwork",
            index=models.Index(
                F("queue_name"),
                -F("priority"),
                F("next_attempt_at"),
                condition=models.Q(("status", "pending"), models.Q(("queue_name", ""), _negated=True)),
                name="nw_due_queue_idx",
            ),
        ),
    ]

# The purge's index (status IN (done, abandoned) AND updated_at < cutoff) holds finished
# rows only (issue 12, item 4): a new pending row, a claim and a save then write no entry
# in it, one index write fewer on each; the purge and the count of abandoned rows use it
# as before (their conditions imply its predicate).

from django.db import migrations, models

from nexus_workflows.index_operations import AddIndexWithoutBlocking, RemoveIndexWithoutBlocking


class Migration(migrations.Migration):
    atomic = False  # concurrent index builds on PostgreSQL
    dependencies = [
        ("nexus_workflows", "0009_notify_new_work_id"),
    ]

    operations = [
        RemoveIndexWithoutBlocking(model_name="deferredwork", name="nw_expiry_idx"),
        AddIndexWithoutBlocking(
            model_name="deferredwork",
            index=models.Index(
                condition=models.Q(("status__in", ["done", "abandoned"])),
                fields=["status", "updated_at"],
                name="nw_expiry_idx",
            ),
        ),
    ]

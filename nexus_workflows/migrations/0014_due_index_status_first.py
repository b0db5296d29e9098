# The due index leads with the status (the claim's equality): on MariaDB, which has no
# partial indexes, nw_due_idx holds every row, and finished rows (due long before any
# pending one) came first in its order, so a claim walked every retained finished row's
# entry before the first pending one (270,000 rows, 0.53 s, at 300,000 rows). On
# PostgreSQL and SQLite the index stays partial (pending rows only) and is read in the
# same order: the status, equal throughout, orders nothing.
#
# Like 0010, the index is dropped and rebuilt CONCURRENTLY on PostgreSQL: writes to the work
# table go on while it builds (a plain build blocked them about 0.4 s per 500,000 rows).

from django.db import migrations, models

from nexus_workflows.index_operations import AddIndexWithoutBlocking, RemoveIndexWithoutBlocking


class Migration(migrations.Migration):
    atomic = False  # concurrent index builds on PostgreSQL
    dependencies = [
        ("nexus_workflows", "0013_mysql_exact_text"),
    ]

    operations = [
        RemoveIndexWithoutBlocking(model_name="deferredwork", name="nw_due_idx"),
        AddIndexWithoutBlocking(
            model_name="deferredwork",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["status", "-priority", "next_attempt_at"],
                name="nw_due_idx",
            ),
        ),
    ]

# The due index leads with the status (the claim's equality): on MariaDB, which has no
# partial indexes, nw_due_idx holds every row, and finished rows (due long before any
# pending one) came first in its order, so a claim walked every retained finished row's
# entry before the first pending one (270,000 rows, 0.53 s, at 300,000 rows). On
# PostgreSQL and SQLite the index stays partial (pending rows only) and is read in the
# same order: the status, equal throughout, orders nothing.
#
# Like 0010, the index is built CONCURRENTLY on PostgreSQL: writes to the work table go on
# while it builds (a plain build blocked them about 0.4 s per 500,000 rows). It is built
# first, under a temporary name, and only then is the old one dropped and the new one renamed:
# claims are never left without a due index for the length of a build (as they were when
# this migration dropped the old index first). The state is that of RemoveIndex + AddIndex.

from django.db import migrations, models

from nexus_workflows.index_operations import ReplaceIndexWithoutBlocking


class Migration(migrations.Migration):
    atomic = False  # concurrent index builds on PostgreSQL
    dependencies = [
        ("nexus_workflows", "0013_mysql_exact_text"),
    ]

    operations = [
        ReplaceIndexWithoutBlocking(
            model_name="deferredwork",
            old_name="nw_due_idx",
            index=models.Index(
                condition=models.Q(("status", "pending")),
                fields=["status", "-priority", "next_attempt_at"],
                name="nw_due_idx",
            ),
        ),
    ]

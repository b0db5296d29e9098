"""Live runners and per-minute outcome counts: the rows behind the operator's view.

Times here come from the database's clock (``Now()``), like the claims'.
"""

from __future__ import annotations

from django.db import models

from nexus_workflows.limits import KIND_MAX_LENGTH


class Runner(models.Model):
    """One ``runworkflows`` process: written at start, refreshed with its heartbeat and
    deleted at a clean shutdown. A row not seen for ``STALE_AFTER`` belongs to a runner
    that died; it is purged ``RETENTION`` after it was last seen."""

    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    version = models.CharField(max_length=64)
    kinds = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    # Attempts whose prepare was running at the last refresh.
    in_flight = models.PositiveIntegerField(default=0)
    # Outcomes this runner wrote since it started: done, and failed (rescheduled or abandoned).
    done = models.PositiveBigIntegerField(default=0)
    failed = models.PositiveBigIntegerField(default=0)
    # How it learns of new work (nexus_workflows.deferred.wakeup.WakeupMode), and since when.
    wakeup_mode = models.CharField(max_length=20, default="poll")
    wakeup_mode_since = models.DateTimeField(null=True)

    class Meta:
        verbose_name = "runner"
        verbose_name_plural = "runners"
        indexes = [models.Index(fields=["last_seen_at"], name="nw_runner_seen_idx")]

    def __str__(self) -> str:
        return f"runner {self.host}:{self.pid}"


class OutcomeCount(models.Model):
    """How many attempts of one kind ended one way in one minute (by the database's clock).

    Runners add to these rows after the outcomes they write (one upsert at most a second),
    so the dashboard reads at most 1,440 rows per kind and outcome for a day, however much
    work ran. Rows older than the dashboard's window are purged with the runners' sweep.
    """

    minute = models.DateTimeField()
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    outcome = models.CharField(max_length=16)
    count = models.PositiveBigIntegerField(default=0)

    class Meta:
        verbose_name = "outcome count"
        verbose_name_plural = "outcome counts"
        constraints = [
            models.UniqueConstraint(fields=["minute", "kind", "outcome"], name="nw_outcome_count_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.outcome} x{self.count} at {self.minute:%Y-%m-%d %H:%M}"


class OutcomeFlush(models.Model):
    """One batch of counts a runner added, by its token: a retry of a batch whose
    acknowledgement was lost in an outage (the statement committed, the answer never came)
    finds its token taken and adds nothing. Purged with the counts."""

    token = models.CharField(max_length=32, primary_key=True)
    at = models.DateTimeField()

    class Meta:
        verbose_name = "outcome count batch"
        verbose_name_plural = "outcome count batches"

    def __str__(self) -> str:
        return self.token

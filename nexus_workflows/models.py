"""Database models of nexus_workflows.

Only portable ORM operations are used on these tables: conditional ``UPDATE … WHERE``
as compare-and-set (judged by the number of rows matched), unique constraints for
deduplication, and no ``select_for_update`` in the core paths.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.utils import timezone

from .limits import DEDUPE_KEY_MAX_LENGTH, KIND_MAX_LENGTH


class Status(models.TextChoices):
    PENDING = "pending", "Pending"
    PROCESSING = "processing", "Processing"
    DONE = "done", "Done"
    ABANDONED = "abandoned", "Abandoned"


#: The unique constraint on (kind, dedupe_key): the only IntegrityError that is a dedupe race.
DEDUPE_CONSTRAINT = "nw_unique_dedupe_key"

#: Statuses whose rows are purged once RETENTION has passed since their last update.
FINISHED_STATUSES = (Status.DONE, Status.ABANDONED)


class DeferredWorkQuerySet(models.QuerySet["DeferredWork"]):
    def due(self, now: datetime | Any) -> DeferredWorkQuerySet:
        """Pending work whose next attempt time has come (``nw_due_idx``)."""
        return self.filter(status=Status.PENDING, next_attempt_at__lte=now)

    def stale(self, cutoff: datetime | Any) -> DeferredWorkQuerySet:
        """Processing work whose runner stopped heart-beating before ``cutoff`` (``nw_stale_idx``)."""
        return self.filter(status=Status.PROCESSING, heartbeat_at__lt=cutoff)

    def expired(self, cutoff: datetime | Any) -> DeferredWorkQuerySet:
        """Done or abandoned work last updated before ``cutoff`` (``nw_expiry_idx``)."""
        return self.filter(status__in=FINISHED_STATUSES, updated_at__lt=cutoff)

    def held(self, claim_token: str) -> DeferredWorkQuerySet:
        """The rows still held under one claim token: the fence of every later write."""
        return self.filter(claim_token=claim_token, status=Status.PROCESSING)


class DeferredWork(models.Model):
    """One unit of durable work: its trigger, its checkpoint journal and its state."""

    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    dedupe_key = models.CharField(max_length=DEDUPE_KEY_MAX_LENGTH)
    trigger = models.JSONField()
    checkpoints = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # Failed (or lost) attempts so far; the next run is attempt number ``attempt``.
    attempt = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claim_token = models.CharField(max_length=32, blank=True, default="")
    claimed_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # When the current attempt's prepare started (written shortly after it does, and by
    # every save()); a reclaim counts the lost attempt only if this is set.
    started_at = models.DateTimeField(null=True, blank=True)
    # Claims lost before their prepare started: they cost no attempt, but are bounded.
    lost_unstarted = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # Failed, lost and released attempts, newest last (bounded); successes leave no entry.
    history = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    # Set explicitly by every write: QuerySet.update() does not apply auto_now.
    updated_at = models.DateTimeField(default=timezone.now)

    objects = DeferredWorkQuerySet.as_manager()

    class Meta:
        verbose_name = "deferred work"
        verbose_name_plural = "deferred work"
        constraints = [
            models.UniqueConstraint(fields=["kind", "dedupe_key"], name=DEDUPE_CONSTRAINT),
        ]
        indexes = [
            # The due-work query (status = pending AND next_attempt_at <= now) and the
            # reclaim query (status = processing AND heartbeat_at < cutoff) run on every
            # poll. Partial indexes keep them small however many finished rows are retained,
            # and a row that finishes leaves both.
            models.Index(
                fields=["next_attempt_at"],
                name="nw_due_idx",
                condition=models.Q(status="pending"),
            ),
            models.Index(
                fields=["heartbeat_at"],
                name="nw_stale_idx",
                condition=models.Q(status="processing"),
            ),
            # The purge: status IN (done, abandoned) AND updated_at < cutoff.
            models.Index(fields=["status", "updated_at"], name="nw_expiry_idx"),
        ]
        permissions = [
            ("revive_deferredwork", "Can revive abandoned work and run pending work now"),
            ("reveal_deferredwork", "Can reveal triggers, checkpoints and error messages"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.status})"


from .observability.models import OutcomeCount, OutcomeFlush, Runner  # noqa: E402,F401
from .phi.models import PhiToken, TokenMap  # noqa: E402,F401

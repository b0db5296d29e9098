"""Database models of nexus_workflows.

Only portable ORM operations are used on these tables: conditional ``UPDATE … WHERE``
as compare-and-set (judged by the number of rows matched), unique constraints for
deduplication, and no ``select_for_update`` in the core paths.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import F
from django.utils import timezone

from nexus_workflows.limits import (
    BACKEND_ALIAS_MAX_LENGTH,
    DEDUPE_KEY_MAX_LENGTH,
    KIND_COLUMN_LENGTH,
    QUEUE_NAME_MAX_LENGTH,
)


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

    def tasks(self) -> DeferredWorkQuerySet:
        """Rows of Django tasks (``nw_task_result_idx`` with a dedupe key)."""
        return self.exclude(queue_name="")

    def held(self, claim_token: str) -> DeferredWorkQuerySet:
        """The rows still held under one claim token: the fence of every later write."""
        return self.filter(claim_token=claim_token, status=Status.PROCESSING)


class DeferredWork(models.Model):
    """One unit of durable work: its trigger, its checkpoint journal and its state.

    A row is either a deferred workflow (``kind`` is its registered kind, ``queue_name`` is
    empty) or a Django task enqueued through :class:`nexus_workflows.tasks.DeferredBackend`
    (``kind`` is the task's import path, which always has a dot; ``queue_name`` is set).
    """

    kind = models.CharField(max_length=KIND_COLUMN_LENGTH)
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
    # Flow control (nexus_workflows.flow): keyed hashes of the serial and rate keys, set
    # at enqueue (never the keys themselves: they are often phone numbers), and the
    # concurrency slot a processing row holds.
    # NULL, not "", means "no key": NULLs never collide in the unique index below.
    serial_key_hash = models.CharField(max_length=64, null=True, blank=True, editable=False)  # noqa: DJ001
    rate_key_hash = models.CharField(max_length=64, null=True, blank=True, editable=False)  # noqa: DJ001
    flow_slot = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    # Claimed highest first; Django tasks allow -100 to 100, workflows are all 0.
    priority = models.SmallIntegerField(default=0)
    # Django tasks only (empty for workflows): the task's queue and backend alias, and
    # the result id a caller looks the task up by is the dedupe key.
    queue_name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, blank=True, default="")
    backend_name = models.CharField(max_length=BACKEND_ALIAS_MAX_LENGTH, blank=True, default="")
    # Set by claims, for Django tasks' results: when the work was first claimed and last
    # claimed, and every runner that claimed it (so a task's attempts are len(worker_ids)).
    # Unlike started_at (this attempt's prepare started; NULL again after every claim),
    # first_started_at is set once and kept.
    first_started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    worker_ids = models.JSONField(default=list, blank=True)
    # Set when the work is done or abandoned.
    finished_at = models.DateTimeField(null=True, blank=True)
    # Django tasks only: what the task returned (JSON), and one entry per failed attempt
    # ({"exception_class_path", "traceback"}), oldest first.
    return_value = models.JSONField(null=True, blank=True, default=None)
    errors = models.JSONField(default=list, blank=True)

    objects = DeferredWorkQuerySet.as_manager()

    class Meta:
        verbose_name = "deferred work"
        verbose_name_plural = "deferred work"
        constraints = [
            models.UniqueConstraint(fields=["kind", "dedupe_key"], name=DEDUPE_CONSTRAINT),
            # Flow control, enforced by the database whatever the runners believe: a
            # concurrency slot is held by one processing row at a time, and so is a
            # serial key. Both are released by the write that ends the attempt (the row
            # leaves "processing") and kept by a reclaim (it stays "processing").
            models.UniqueConstraint(
                fields=["kind", "flow_slot"],
                name="nw_flow_slot_held_once",
                condition=models.Q(status="processing", flow_slot__isnull=False),
            ),
            models.UniqueConstraint(
                fields=["kind", "serial_key_hash"],
                name="nw_serial_key_running_once",
                condition=models.Q(status="processing", serial_key_hash__isnull=False),
            ),
        ]
        indexes = [
            # The due-work query (status = pending AND next_attempt_at <= now) and the
            # reclaim query (status = processing AND heartbeat_at < cutoff) run on every
            # poll. Partial indexes keep them small however many finished rows are retained,
            # and a row that finishes leaves both.
            # Ordered as claims take due work: highest priority first, then the longest
            # due, so the claim reads the index in order and stops at its LIMIT. The status
            # leads for databases without partial indexes (MariaDB), where the index holds
            # every row and finished ones, due long ago, would come first.
            models.Index(
                fields=["status", "-priority", "next_attempt_at"],
                name="nw_due_idx",
                condition=models.Q(status="pending"),
            ),
            # The same order per kind, and per task queue: a claim reads each kind and
            # queue it takes in order and merges them (sql/postgresql.py, due_ids), so
            # due rows of kinds or queues no runner takes are never walked past.
            # The priority is an expression (its negation), which nw_due_idx cannot give
            # the order of: the planner never reads nw_due_idx filtered by kind instead
            # (its estimates assume the other kinds' rows spread evenly, not ahead).
            # MariaDB has no expression indexes: Django creates neither there; migration 0018
            # builds MariaDB's own, outside the models (sql/mysql.py, DUE_INDEXES).
            models.Index(
                F("kind"),
                -F("priority"),
                F("next_attempt_at"),
                name="nw_due_kind_idx",
                condition=models.Q(status="pending"),
            ),
            models.Index(
                F("queue_name"),
                -F("priority"),
                F("next_attempt_at"),
                name="nw_due_queue_idx",
                condition=models.Q(status="pending") & ~models.Q(queue_name=""),
            ),
            models.Index(
                fields=["heartbeat_at"],
                name="nw_stale_idx",
                condition=models.Q(status="processing"),
            ),
            # Flow control's key look-ups: "an earlier item of this key is pending or
            # processing" and "the earliest ready item of this key".
            models.Index(
                fields=["kind", "serial_key_hash", "id"],
                name="nw_serial_idx",
                condition=models.Q(status__in=["pending", "processing"], serial_key_hash__isnull=False),
            ),
            # The purge: status IN (done, abandoned) AND updated_at < cutoff. Partial, so
            # that a new (pending) row, a claim and a save write no entry in it.
            models.Index(
                fields=["status", "updated_at"],
                name="nw_expiry_idx",
                condition=models.Q(status__in=["done", "abandoned"]),
            ),
            # get_result(id) of a Django task: its result id is the dedupe key. Workflow
            # rows stay out of it.
            models.Index(
                fields=["dedupe_key"],
                name="nw_task_result_idx",
                condition=~models.Q(queue_name=""),
            ),
        ]
        permissions = [
            ("revive_deferredwork", "Can revive abandoned work and run pending work now"),
            ("reveal_deferredwork", "Can reveal triggers, checkpoints and error messages"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.status})"


class FlowWindowSlot(models.Model):
    """One of the ``limit`` slots of a sliding window (``rate_limit``, ``rate_limited``).

    A window of ``limit`` starts per ``period`` is a ring of ``limit`` rows per (name,
    key hash); a start takes a row whose last start is at least ``period`` old by
    compare-and-set (``UPDATE … WHERE started_at <= now - period``, on the database's
    clock). Two starts on one row are thus at least ``period`` apart, so no window of
    ``period`` seconds ever holds more than ``limit`` starts. ``period`` is the one its
    last start was taken under: a window whose period was lengthened since waits until
    the starts the shorter one allowed before it have left (``flow.windows``).
    """

    name = models.CharField(max_length=200)
    key_hash = models.CharField(max_length=64, blank=True, default="")
    slot = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    # Seconds; None for a row last stamped before the column existed (taken as current).
    period = models.FloatField(null=True)

    class Meta:
        verbose_name = "flow window slot"
        constraints = [
            models.UniqueConstraint(fields=["name", "key_hash", "slot"], name="nw_window_slot_unique"),
        ]
        indexes = [models.Index(fields=["started_at"], name="nw_window_prune_idx")]

    def __str__(self) -> str:
        return f"{self.name} slot {self.slot}"


# Django finds an app's models in its models module; these are re-exported explicitly.
from nexus_workflows.observability.models import OutcomeCount as OutcomeCount  # noqa: E402
from nexus_workflows.observability.models import OutcomeFlush as OutcomeFlush  # noqa: E402
from nexus_workflows.observability.models import Runner as Runner  # noqa: E402
from nexus_workflows.phi.models import PhiToken as PhiToken  # noqa: E402
from nexus_workflows.phi.models import TokenMap as TokenMap  # noqa: E402

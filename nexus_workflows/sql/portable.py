"""Every other database: the plain ORM only. No ``RETURNING`` (claims read their rows
back by token, done-writes theirs by the claim token the done row keeps), no precompiled ``INSERT`` (enqueue
uses ``QuerySet.create``), no ``NOTIFY`` (runners poll), and a unique violation is told
by the constraint's name appearing in the database's message."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from django.apps import apps
from django.db import IntegrityError
from django.db.models import QuerySet

__all__ = [
    "claimable",
    "constraint_name",
    "due_ids",
    "due_in_order",
    "lock_waits_at_most",
    "notify",
    "statement_timeout",
    "values_sent_apart",
    "violated_constraint",
]


def violated_constraint(error: IntegrityError) -> str | None:
    """The app's unique constraint whose name the error's message quotes, or None."""
    text = str(error)
    for model in apps.get_app_config("nexus_workflows").get_models():
        for constraint in model._meta.constraints:
            if constraint.name in text:
                return constraint.name
    return None


def of_ids(queryset: QuerySet[Any], ids: Sequence[Any]) -> QuerySet[Any]:
    """The rows ``ids`` of ``queryset``."""
    return queryset.filter(pk__in=ids)


def claimable(candidates: QuerySet[Any], ids: Sequence[Any]) -> QuerySet[Any]:
    """The rows ``ids`` of ``candidates``, as they are: how another database skips a
    locked row is not known here."""
    return candidates.filter(pk__in=ids)


def due_in_order(candidates: QuerySet[Any]) -> QuerySet[Any]:
    """``candidates`` (pending rows of one kind) in the claim's order: highest priority
    first, then the longest due, then the id."""
    return candidates.order_by("-priority", "next_attempt_at", "pk")


def due_ids(using: str, kinds: Sequence[str], queues: Sequence[str] | None, now: Any, limit: int) -> None:
    """None: the claim reads the due rows through the ORM."""
    return None


def constraint_name(error: Exception) -> None:
    """Not read (None): an unknown driver's message may quote the refused row."""
    return None


def lock_waits_at_most(using: str, seconds: float) -> AbstractContextManager[None]:
    """As it is (None): how another database bounds a lock wait is not known here."""
    return nullcontext()


def values_sent_apart(using: str) -> AbstractContextManager[None]:
    """As it is: how another database logs a failed statement is not known here."""
    return nullcontext()


def notify(cursor: object, channel: str, payload: str = "") -> None:
    """No ``NOTIFY`` here: runners find new work by polling."""


def statement_timeout(using: str) -> None:
    """Not known here (None): the purge takes the longest a cancelled batch ran instead
    (:mod:`nexus_workflows.deferred.purge_batches`)."""
    return None

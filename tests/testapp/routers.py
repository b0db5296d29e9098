"""A database router for tests that send the app's work table to another alias."""

from __future__ import annotations

import itertools
from typing import Any


class WorkToPrepared:
    """The app's reads and writes go to the ``prepared`` alias (tests/settings.py)."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return "prepared" if model._meta.app_label == "nexus_workflows" else None

    db_for_write = db_for_read


class WorkReadFromDirect:
    """A read replica's router: the app's reads go to the ``direct`` alias (tests/settings.py),
    its writes to ``default``."""

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return "direct" if model._meta.app_label == "nexus_workflows" else None

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return "default" if model._meta.app_label == "nexus_workflows" else None


class WorkReadFromEitherReplica:
    """Django's documented replica router, made deterministic: each read of the app's rows
    goes to the next of two aliases in turn (``direct``, ``default``; as ``random.choice``
    of two replicas would), its writes to ``default``."""

    def __init__(self) -> None:
        self._reads = itertools.cycle(["direct", "default"])

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return next(self._reads) if model._meta.app_label == "nexus_workflows" else None

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return "default" if model._meta.app_label == "nexus_workflows" else None

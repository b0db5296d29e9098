"""A database router for tests that send the app's work table to another alias."""

from __future__ import annotations

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

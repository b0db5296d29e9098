"""A switch for the app's database alias, so one benchmark process can run ``enqueue`` on
Django's default connection options and on prepared statements, turn by turn. Installed
only around that measurement (``override_settings``), never in a runner's settings."""

from __future__ import annotations

from typing import Any


class WorkTo:
    """The app's reads and writes go to ``alias`` (None: the default alias)."""

    def __init__(self) -> None:
        self.alias: str | None = None

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return self.alias if model._meta.app_label == "nexus_workflows" else None

    db_for_write = db_for_read

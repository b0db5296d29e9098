"""Settings both peer projects share: production-like (DEBUG off, persistent connections),
the database from ``DATABASE_URL``. The peers' virtualenv has no django-environ, so the URL
is parsed here."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlsplit


def database_from_url(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"the peers run on PostgreSQL only; got a {parts.scheme!r} DATABASE_URL")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        # What a production deployment of a long-lived worker uses (and what our project
        # uses): keep connections instead of reconnecting per task. With Django's default
        # CONN_MAX_AGE=0, django-tasks' worker reconnects for every task.
        "CONN_MAX_AGE": 600,
        "CONN_HEALTH_CHECKS": True,
    }


DEBUG = False
SECRET_KEY = "benchmark-only-secret-key-not-for-production-use-0123456789"
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}

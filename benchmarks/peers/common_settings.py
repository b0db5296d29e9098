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

# Logging as our project configures it (project/settings.py, which the benchmark's runner
# uses): each system's own loggers at INFO on the console, which the benchmark sends to
# the worker's log file. All three systems log a line as a job starts and one as it ends;
# without this, Procrastinate's lines would be dropped (no handler: Python prints only
# warnings and worse) and it alone would not pay for them.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)-7s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        name: {"handlers": ["console"], "level": "INFO", "propagate": False}
        for name in ("procrastinate", "django_tasks", "django_tasks_db")
    },
}

"""Readable logs from ``runworkflows`` without any configuration.

A project that configures logging for ``nexus_workflows`` (a handler on it, or on an
ancestor it propagates to, such as the root logger) keeps full control. One that does not
would see nothing but warnings through Python's last-resort handler; for it, the command
prints the start line and one line per state change on stderr.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from django.db import connections

LOGGER = "nexus_workflows"
FORMAT = "%(asctime)s %(levelname)-7s %(message)s"


def project_handles_logging(logger: logging.Logger | None = None) -> bool:
    """Whether a record of ``nexus_workflows`` reaches a handler the project set up.

    ``Logger.hasHandlers()`` walks up the hierarchy as a record would (stopping where
    ``propagate`` is off); ``logging.lastResort`` does not count.
    """
    return (logger or logging.getLogger(LOGGER)).hasHandlers()


def install_default_handler(level: int = logging.INFO) -> logging.Handler | None:
    """Log ``nexus_workflows`` to stderr when nothing else would; returns the handler
    installed (``None`` when the project handles logging). Remove it with
    :func:`remove_default_handler`."""
    logger = logging.getLogger(LOGGER)
    if project_handles_logging(logger):
        return None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(level)
    return handler


def remove_default_handler(handler: logging.Handler | None) -> None:
    if handler is not None:
        logging.getLogger(LOGGER).removeHandler(handler)


def describe_database(using: str) -> str:
    """``postgresql nexus on 127.0.0.1:5432``: vendor, name and address, never credentials."""
    connection = connections[using]
    settings = connection.settings_dict
    name = str(settings.get("NAME") or "")
    if connection.vendor == "sqlite":
        return f"sqlite {name}"
    host = settings.get("HOST") or "localhost"
    port = settings.get("PORT")
    return f"{connection.vendor} {name} on {host}{f':{port}' if port else ''}"


def start_line(
    *,
    version: str,
    using: str,
    kinds: Sequence[str],
    concurrency: int,
    wakeup: str,
    once: bool = False,
    metrics: str = "",
    queues: Sequence[str] | None = (),
    worker_id: str = "",
    dead_connections: str = "",
) -> str:
    parts = [
        f"nexus_workflows {version}",
        f"database {describe_database(using)}",
        f"kinds {', '.join(kinds) or '(none)'}",
        f"concurrency {concurrency}",
        f"wake-ups: {wakeup}",
    ]
    if once:
        parts.append("once")
    if metrics:
        parts.append(f"metrics on {metrics}")
    if queues != []:  # Django task queues (nexus_workflows.tasks); None takes every queue
        parts.append(f"task queues {'(all)' if queues is None else ', '.join(queues)}")
    if worker_id:
        parts.append(f"worker id {worker_id}")
    if dead_connections:
        parts.append(f"dead connections: {dead_connections}")
    return "; ".join(parts)

"""What the purge fault tests share: a backlog of expired rows, the runner's database URL
with session settings of its own, and waiting with the runner's output at hand."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import quote

from django.utils import timezone

from nexus_workflows.models import DeferredWork, Status
from tests.processes import ManagePy, url_of_test_database, wait_for


def make_expired(count: int) -> None:
    """``count`` done rows of ``test-ledger`` past RETENTION (a day), keys ``expired-N``."""
    then = timezone.now() - timedelta(days=2)
    DeferredWork.objects.bulk_create(
        DeferredWork(
            kind="test-ledger", dedupe_key=f"expired-{n}", trigger={}, status=Status.DONE, updated_at=then
        )
        for n in range(count)
    )


def expired_count() -> int:
    return DeferredWork.objects.filter(kind="test-ledger", dedupe_key__startswith="expired-").count()


def is_done(work_id: str) -> bool:
    return DeferredWork.objects.filter(pk=work_id, status=Status.DONE).exists()


def with_session_settings(**settings: str | int) -> str:
    """DATABASE_URL of the test database, its sessions starting with ``settings``
    (``-c name=value`` each; django-environ puts ``options`` into the connection's OPTIONS)."""
    options = " ".join(f"-c {name}={value}" for name, value in settings.items())
    return f"{url_of_test_database()}?options={quote(options, safe='')}"


def with_statement_timeout(milliseconds: int) -> str:
    """DATABASE_URL of the test database, its sessions cancelling statements after
    ``milliseconds``."""
    return with_session_settings(statement_timeout=milliseconds)


def wait_for_runner(runner: ManagePy, predicate: Callable[[], Any], *, timeout: float, what: str) -> None:
    """``wait_for``, failing with the runner's output."""
    try:
        wait_for(predicate, timeout=timeout, what=what)
    except AssertionError as error:
        raise AssertionError(f"{error}; the runner's output:\n{runner.output()}") from None


# A log record's line ("2026-12-05 18:38:21,328 WARNING nexus_workflows…"), not Django's
# system check report, which Django 6.1 prints at every command on MariaDB ("WARNINGS:",
# models.W036/W037: it runs the database checks by default).
_LOGGED_WARNING = re.compile(r"^\S+ \S+ WARNING ")


def warnings_of(output: str) -> list[str]:
    return [line for line in output.splitlines() if _LOGGED_WARNING.match(line)]


def purge_delete_pid(*, waiting_for_a_lock: bool = False) -> int | None:
    """The backend pid of another session running a DELETE of the work table (the
    runner's purge), or None; with ``waiting_for_a_lock``, only while it waits for one."""
    from django.db import connection

    table = connection.ops.quote_name(DeferredWork._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND state = 'active' AND query LIKE %s "
            "AND (NOT %s OR wait_event_type = 'Lock')",
            [f"DELETE FROM {table}%", waiting_for_a_lock],
        )
        row = cursor.fetchone()
    return row[0] if row is not None else None


def purge_waits_for_a_lock() -> bool:
    """Whether another session's DELETE of the work table (the runner's purge) waits for a
    row lock now: PostgreSQL (``pg_stat_activity``), or MariaDB, where a DELETE running
    over 100 ms stands for it (``PROCESSLIST``; a few rows take well under a millisecond,
    and ``INNODB_TRX`` did not list the runner's waiting statement on 10.11)."""
    from django.db import connection

    if connection.vendor != "mysql":
        return purge_delete_pid(waiting_for_a_lock=True) is not None
    table = connection.ops.quote_name(DeferredWork._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() "
            "AND COMMAND = 'Query' AND TIME_MS > 100 AND INFO LIKE %s",
            [f"DELETE FROM {table}%"],
        )
        return cursor.fetchone() is not None

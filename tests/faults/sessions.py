"""What the prepare-session fault tests (``test_prepare_sessions.py``) run inside a
``manage.py shell`` on the private database, next to a runner: enqueue work, and end the
server session a prepare's own ORM use opened, the way an operator's
``idle_session_timeout`` or a DBA's ``pg_terminate_backend`` ends it.

A prepare's session is found by its last statement, which names the test app's ledger
table: no other session of the runner touches that table."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from django.db import connection

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork
from tests.processes import wait_for

PREPARE_SESSIONS = (
    "SELECT pid FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE %s"
)
WAIT = 20.0  # seconds any one step may take on a loaded machine before the driver gives up


def prepare_sessions() -> list[int]:
    """Backend pids of the sessions whose last statement touched the ledger table."""
    with connection.cursor() as cursor:
        cursor.execute(PREPARE_SESSIONS, ["%testapp_ledger%"])
        return [pid for (pid,) in cursor.fetchall()]


def terminate_prepare_session() -> None:
    """``pg_terminate_backend`` of the one session a prepare left open; returns once the
    server has ended it."""
    (pid,) = wait_for(prepare_sessions, timeout=WAIT, what="the prepare's session")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert cursor.fetchone() == (True,)
    wait_for(lambda: pid not in prepare_sessions(), timeout=WAIT, what="the terminated session gone")
    print(f"terminated the prepare's session (backend {pid})")


def wait_until_ended_idle() -> None:
    """Wait until the server has ended the prepare's session for sitting idle
    (``idle_session_timeout``; it may have already); this session polls, so it never sits
    idle itself."""
    wait_for(lambda: not prepare_sessions(), timeout=WAIT, what="the prepare's session ended idle")
    print("the server ended the prepare's idle session")


def done(kind: str, key: str) -> bool:
    return DeferredWork.objects.filter(kind=kind, dedupe_key=key, status="done").exists()


def enqueue_one_by_one(kind: str, items: int, *, fault: str, gap: float) -> None:
    """Enqueue ``items`` of ``kind``, each once the previous one is done and the session
    its prepare used was ended (``fault``), and at least ``gap`` seconds after it was done:
    every attempt but the first meets a connection the server ended while it sat idle."""
    for number in range(items):
        if number:
            finished = time.monotonic()
            if fault == "pg_terminate_backend":
                terminate_prepare_session()
            else:
                wait_until_ended_idle()
            threading.Event().wait(max(0.0, gap - (time.monotonic() - finished)))
            connection.close()  # this session may have sat idle past the timeout too
        enqueue(kind, {"key": str(number)})
        wait_for(lambda n=number: done(kind, str(n)), timeout=WAIT, what=f"item {number} done")


def end_session_mid_attempt(kind: str, directory: str) -> None:
    """Enqueue one item of a ``…-session-ends`` kind; while its first attempt waits, end
    the session its first query opened; then let it query again, and wait until done."""
    waiting, until = Path(directory) / "waiting", Path(directory) / "until"
    enqueue(kind, {"key": "0", "waiting_file": str(waiting), "until_file": str(until)})
    wait_for(waiting.exists, timeout=WAIT, what="the first attempt waiting")
    terminate_prepare_session()
    until.touch()
    wait_for(lambda: done(kind, "0"), timeout=WAIT, what="the item done")

"""A guard of the PostgreSQL legs: a test that leaves sessions of this process open on the
test database after its own clean-up fails (an error at its teardown), naming them.

Such a session is a thread, connection or runner the test (or the app) did not end: it
outlives the test, and at the end of the run it keeps the test database from being
dropped ("being accessed by other users"), with nothing to say which test left it.

Only this process's own sessions count: those whose client socket is open in this process,
less the main thread's Django connections, which Django keeps between tests. A PgBouncer's
server sessions (the wake-up tests' fixture keeps one for the whole run) are its own, not
this process's; a runner process ending meanwhile has sockets of its own too. The cost:
one query per test, on a session of the server's maintenance database (never on the test
database: the drop at the end must not wait for it); this process's sockets are read only
when the test database has other sessions at all, and a suspect gets a garbage collection
and two seconds to go before the test fails.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Seconds a suspect session gets to end (a thread closing its connection as it ends).
GRACE = 2.0

_watcher: list[Any] = []  # the maintenance-database session, once opened
_reported: set[int] = set()  # sessions a test failed for already: not the next tests' fault


def _own_ports() -> set[int]:
    """The local TCP ports of this process's open sockets."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _watcher_session() -> Any:
    import psycopg
    from django.db import connections

    if not _watcher:
        params = dict(connections["direct"].get_connection_params())
        for django_only in ("cursor_factory", "context"):
            params.pop(django_only, None)
        _watcher.append(psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True))
    return _watcher[0]


def _main_thread_pids() -> set[int]:
    from django.db import connections

    pids = set()
    for wrapper in connections.all(initialized_only=True):
        session = wrapper.connection
        if wrapper.vendor == "postgresql" and session is not None and not session.closed:
            pids.add(session.info.backend_pid)
    return pids


def _left_open(database: str) -> list[tuple[Any, ...]]:
    """This process's sessions on ``database`` other than the main thread's Django ones."""
    others = [
        row
        for row in _watcher_session()
        .execute(
            "SELECT pid, client_port, state, backend_start, left(query, 200) FROM pg_stat_activity "
            "WHERE datname = %s AND client_port IS NOT NULL",
            [database],
        )
        .fetchall()
        if row[0] not in _main_thread_pids() and row[0] not in _reported
    ]
    if not others:
        return []
    ours = _own_ports()
    return [row for row in others if row[1] in ours]


def _test_database() -> str | None:
    from django.db import connections

    settings = connections["default"].settings_dict
    if settings["ENGINE"] != "django.db.backends.postgresql" or not settings["NAME"].startswith("test_"):
        return None  # not PostgreSQL, or no test database set up (yet)
    return str(settings["NAME"])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    database = _test_database()
    if database is None or not _left_open(database):
        return
    deadline = time.monotonic() + GRACE
    gc.collect()  # a connection nothing refers to any more is closed now
    while (left := _left_open(database)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        _reported.update(pid for pid, *_ in left)
        sessions = "; ".join(
            f"pid {pid} from port {port}, {state} since {started:%H:%M:%S}, last {query.strip()[:120]!r}"
            for pid, port, state, started, query in left
        )
        pytest.fail(
            f"{item.nodeid} left {len(left)} session(s) of this process open on the test database "
            f"(a thread, connection or runner not ended): {sessions}",
            pytrace=False,
        )


def pytest_sessionfinish() -> None:
    while _watcher:
        _watcher.pop().close()

"""The wake-up listener's session under a server's ``idle_session_timeout``: its keep-alive
statement comes every half timeout, however notifications fall. A notification that woke
the listener just before a keep-alive was due used to start a whole listen turn, so the
statement came up to a turn late: with a timeout of a second, at the timeout itself, and
the server ended the session (CI saw "listener lost its connection (IdleSessionTimeout)")."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest

from nexus_workflows.deferred import wakeup
from nexus_workflows.sql import postgresql
from tests.processes import wait_for
from tests.raw_connections import raw_connection

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql, pytest.mark.slow]

IDLE_TIMEOUT = 1.0  # seconds; the listener keeps its session alive every half of it
# Notifications a little under the keep-alive interval apart: each wakes the listener just
# before a keep-alive is due.
NOTIFY_EVERY = 0.45
NOTIFICATIONS = 10


class TimedListener(wakeup.PostgresListener):
    """A listener whose session the server ends after IDLE_TIMEOUT idle (set on the
    session, not the shared database), counting its connects and timing its keep-alives."""

    def __init__(self) -> None:
        super().__init__("default", threading.Event(), on_any_work=lambda: None)
        self.connects = 0
        self.keep_alives: list[float] = []

    def _connect(self) -> Any:
        connection = super()._connect()
        connection.execute(f"SET idle_session_timeout = '{IDLE_TIMEOUT:g}s'")
        self._keep_alive_every = (postgresql.idle_session_timeout(connection) or 0) / 2
        self.connects += 1
        return connection


def test_the_listener_keeps_its_session_alive_however_notifications_fall(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listener = TimedListener()
    keep_alive = postgresql.keep_alive

    def timed(connection: Any) -> None:
        listener.keep_alives.append(time.monotonic())
        keep_alive(connection)

    monkeypatch.setattr(postgresql, "keep_alive", timed)
    listener.start()
    try:
        wait_for(lambda: listener.keep_alives, timeout=15, what="a first keep-alive")
        with raw_connection() as sender:
            for number in range(NOTIFICATIONS):
                sender.execute(f"NOTIFY {wakeup.CHANNEL}, 'ended nw-other-kind-{number}'")
                time.sleep(NOTIFY_EVERY)  # pacing of the sender, not synchronisation
    finally:
        listener.stop()
    gaps = [later - earlier for earlier, later in itertools.pairwise(listener.keep_alives)]
    # Half the timeout apart, with room for a slow statement; never near the timeout.
    assert max(gaps) < 0.8 * IDLE_TIMEOUT, gaps
    assert len(gaps) >= NOTIFICATIONS * NOTIFY_EVERY / IDLE_TIMEOUT, gaps
    assert listener.connects == 1  # the server never ended the session

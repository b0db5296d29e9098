"""The runner's own connections (its loop's, its heartbeats', its journal writers') honour
``CONN_MAX_AGE`` as its workers' do and as Django's request cycle does: one older than a
positive ``CONN_MAX_AGE`` is closed at the next safe point (between turns, beats, batches)
and the next statement opens a new session; with ``None`` (persistent) each keeps its one.
Sessions are told apart by their PostgreSQL backend pid, and the replaced ones are gone
from ``pg_stat_activity``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, connections
from django.db.backends.signals import connection_created
from django.test import override_settings

from nexus_workflows import enqueue
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.models import DeferredWork, Status
from tests.processes import wait_for
from tests.raw_connections import live_pids

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql]

SETTINGS = {
    "POLL_INTERVAL": 0.05,
    "HEARTBEAT_INTERVAL": 0.1,
    "STALE_AFTER": 30,
    "SHUTDOWN_GRACE": 2,
    "WAKEUP": False,
}
#: The runner's own threads: its loop (the test's thread), its heartbeats, a journal writer.
OWN = ("test-runner", "nexus-workflows-heartbeat", "nexus-workflows-journal-0")


@pytest.fixture
def sessions() -> Iterator[dict[str, list[int]]]:
    """The backend pid of each session each thread opened, by thread name, in order."""
    opened: dict[str, list[int]] = {}

    def record(sender: Any, connection: Any, **kwargs: Any) -> None:
        if connection.alias == "default":
            name = threading.current_thread().name
            opened.setdefault(name, []).append(connection.connection.info.backend_pid)

    connection_created.connect(record, weak=False)
    yield opened
    connection_created.disconnect(record)


def run_work_for(register_workflow: Any, seconds: float, sessions: dict[str, list[int]]) -> list[int]:
    """A runner that runs one item after another (each saving a checkpoint: the journal
    writer's) for ``seconds``, every item done; returns the pids live at the end."""

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        save({"step": trigger["n"]})

    kind = register_workflow(prepare, retry_schedule=[1]).kind
    connections.close_all()
    with override_settings(NEXUS_WORKFLOWS=SETTINGS):
        runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        ids = []
        try:
            ends = time.monotonic() + seconds
            while time.monotonic() < ends:
                ids.append(enqueue(kind, {"key": str(len(ids)), "n": len(ids)}))
                wait_for(
                    lambda: DeferredWork.objects.get(pk=ids[-1]).status == Status.DONE,
                    timeout=30,
                    what="the item to run",
                )
            wait_for(lambda: sessions.keys() >= set(OWN), timeout=10, what="every own thread's session")
            alive = live_pids()
        finally:
            runner.request_stop()
            thread.join(30)
    assert not thread.is_alive()
    assert DeferredWork.objects.filter(pk__in=ids, status=Status.DONE).count() == len(ids)
    saved = {row.checkpoints["step"] for row in DeferredWork.objects.filter(pk__in=ids)}
    assert saved == set(range(len(ids)))
    return sorted(alive)


def test_the_runners_own_connections_are_replaced_past_conn_max_age(
    register_workflow: Any, monkeypatch: pytest.MonkeyPatch, sessions: dict[str, list[int]]
) -> None:
    """On the old code the loop, the heartbeat and the journal writer kept their first
    sessions for the runner's life (only the workers' were replaced)."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 1)  # every thread's alias
    alive = set(run_work_for(register_workflow, 3.5, sessions))
    for name in OWN:
        pids = sessions[name]
        assert len(set(pids)) >= 2, (name, pids)
        assert not set(pids[:-2]) & alive, (name, pids)  # replaced sessions ended


def test_with_persistent_connections_the_runner_keeps_its_own(
    register_workflow: Any, monkeypatch: pytest.MonkeyPatch, sessions: dict[str, list[int]]
) -> None:
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", None)
    run_work_for(register_workflow, 2.5, sessions)
    for name in OWN:
        assert len(sessions[name]) == 1, (name, sessions[name])

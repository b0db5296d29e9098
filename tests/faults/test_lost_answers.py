"""Fault suite: an outcome write whose commit succeeded but whose answer was lost, because
the private PostgreSQL cluster crashed (``pg_ctl restart -m immediate``) between the two.
The runner writes the outcome again after the outage; it matches nothing, and the runner
must still count it as what it was (done, rescheduled, released, abandoned), not "claim
lost; result discarded"."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.drains import TABLE, query, run_to_end
from tests.faults.servers import PrivatePostgres
from tests.processes import ManagePy, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

# No heartbeat while commits are held: one waiting for its answer would hold the row's
# lock, and the done would wait for that lock instead of its own answer.
SETTINGS = {"POLL_INTERVAL": 0.2, "HEARTBEAT_INTERVAL": 30, "STALE_AFTER": 120, "SHUTDOWN_GRACE": 5}

ENQUEUE = """
from nexus_workflows import enqueue
enqueue("test-ends-when-told", {{"key": "1", "end": {end!r}, "until_file": {until!r}}})
"""

# How the first attempt ends (tests.testapp.workflows.ends_when_told), the row's status
# once the outcome's first commit went through, the runner's last line about the item (a
# rescheduled or released item runs again and is done) and the counts it ends with.
CASES = {
    "done": ("done", "done", "attempt 1 of 4: done", {"done": 1}),
    "rescheduled": ("transient", "pending", "attempt 2 of 4: done", {"done": 1, "rescheduled": 1}),
    "released": ("outage", "pending", "attempt 1 of 4: done", {"done": 1, "released": 1}),
    "abandoned": ("permanent", "abandoned", "abandoned: permanent error", {"abandoned": 1}),
}


def execute(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:  # ALTER SYSTEM: no transaction
        connection.execute(sql)


def waiting_for_a_standby(url: str, text: str) -> list[tuple[Any, ...]]:
    """Sessions whose commit waits for a synchronous standby, running a statement with ``text``."""
    sql = (
        f"SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query LIKE '%{text}%' "
        "AND pid <> pg_backend_pid()"
    )
    return query(url, sql) or []


def hold_commits_unanswered(server: PrivatePostgres) -> None:
    """From now on every commit that wrote something is written but not answered: it waits
    for a synchronous standby that does not exist. Returns once a probe's commit (on the
    ``postgres`` database) waits so: the setting reaches the server's processes a moment
    after the reload."""
    import psycopg

    execute(server.url(), "CREATE TABLE IF NOT EXISTS nw_probe (n int)")
    execute(server.url(), "ALTER SYSTEM SET synchronous_standby_names = 'nw_no_such_standby'")
    execute(server.url(), "SELECT pg_reload_conf()")
    held = threading.Event()

    def probe() -> None:
        with psycopg.connect(server.url(), autocommit=True) as connection:
            while not held.is_set():
                connection.execute("INSERT INTO nw_probe VALUES (1)")

    thread = threading.Thread(target=probe)
    thread.start()
    try:
        waiting = wait_for(lambda: waiting_for_a_standby(server.url(), "nw_probe"), timeout=30, what="held")
        ((pid,), *_) = waiting
        held.set()
        # Its commit stays written; the cancel only ends its wait (with a warning).
        execute(server.url(), f"SELECT pg_cancel_backend({int(pid)})")
    finally:
        held.set()
        thread.join(30)


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivatePostgres]:
    """One private cluster for the module, with a migrated database each test copies."""
    server = PrivatePostgres()
    try:
        server.start()
        server.create_database("nw_template")
        run_to_end("migrate", "--no-input", "-v", "0", url=server.url("nw_template"))
        yield server
    finally:
        server.cleanup()


@pytest.mark.parametrize("outcome", list(CASES))
def test_an_outcome_whose_answer_was_lost_in_a_crash_counts_as_written(
    cluster: PrivatePostgres, tmp_path: Path, report_figures: Callable[[str], None], outcome: str
) -> None:
    end, status_after_commit, last_line, counts = CASES[outcome]
    name = f"nw_faults_answer_{outcome}"
    execute(cluster.url(), f'CREATE DATABASE "{name}" TEMPLATE nw_template')
    url = cluster.url(name)
    until = tmp_path / "until"
    run_to_end("shell", "-c", ENQUEUE.format(end=end, until=str(until)), url=url)
    runner = ManagePy("runworkflows", "--kind", "test-ends-when-told", settings=SETTINGS, database_url=url)
    try:
        runner.wait_for_output("runner started", timeout=60)
        # Begun (journalled, so marked started): the attempt's next write is its outcome.
        began = f"SELECT 1 FROM {TABLE} WHERE status = 'processing' AND checkpoints ? 'began'"
        wait_for(lambda: query(url, began), timeout=30, what="the attempt began")
        hold_commits_unanswered(cluster)
        try:
            until.touch()  # the prepare ends
            # Every outcome write sets last_error (a done clears it); no other write does.
            what = "the outcome committed"
            wait_for(lambda: waiting_for_a_standby(url, "last_error"), timeout=30, what=what)
        except BaseException:
            # Commits answered again: left held, every commit on the cluster (the next
            # case's CREATE DATABASE) waited for ever, and the whole run with it.
            execute(url, "ALTER SYSTEM RESET synchronous_standby_names")
            execute(url, "SELECT pg_reload_conf()")
            raise
        # The crash: the write is in the WAL, its answer never left. Back without a standby.
        execute(url, "ALTER SYSTEM RESET synchronous_standby_names")
        away = cluster.restart("immediate")
        # The first commit did succeed.
        assert query(url, f"SELECT status FROM {TABLE}") == [(status_after_commit,)]
        # (The old code said "claim lost" for the write sent again; a done or abandoned
        # item then has no line to come.)
        ended = (last_line, "claim lost") if outcome in ("done", "abandoned") else (last_line,)
        wait_for(lambda: any(line in runner.output() for line in ended), timeout=60, what="the item's end")
        assert runner.terminate() == 0, runner.output()
        output = runner.output()
    finally:
        runner.close()
    report_figures(f"{outcome}'s answer lost in a crash: server away {away:.2f}s; the runner wrote it again")
    assert "database unavailable (" in output  # the runner did see the outage
    assert "claim lost" not in output, output
    summary = re.search(r"runner stopped: (.*)$", output, re.MULTILINE)
    assert summary, output
    reported = {name: int(n) for n, name in re.findall(r"(\d+) (\w+)", summary.group(1)) if int(n)}
    assert reported == counts, output

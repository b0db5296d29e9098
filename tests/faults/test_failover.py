"""Fault suite: the runner's database fails over to a hot standby during a drain. The
runner connects through a proxy (one address, as behind a virtual IP or a DNS name that
moves); the primary dies (``pg_ctl stop -m immediate``), the proxy sends new connections
to the standby while it is still read-only (every write refused with SQLSTATE 25006),
then the standby is promoted. One outage, whatever it looked like: no attempt is consumed,
no item runs twice at once or to the end twice, the runner stays up and says "database
unavailable", never that an item failed.

The standby replicates synchronously: a commit is answered only once the standby has it.
With asynchronous replication a failover may lose commits already answered (a ``save()``
that returned, an item marked done), and no client could then run each item once."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.faults.drains import TABLE, done_count, query, run_to_end
from tests.faults.servers import PrivatePostgres
from tests.processes import ManagePy, overlapping, read_intervals, wait_for
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

DATABASE = "nw_faults_failover"
ITEMS = 40
# A claim whose commit reached the standby but whose answer was lost with the primary is
# given back once the runner reaches the new primary; STALE_AFTER stays short so that one
# the give-back missed (its statement ran on after the give-back) comes back within the test.
SETTINGS = {
    "POLL_INTERVAL": 0.2,
    "HEARTBEAT_INTERVAL": 1,
    "STALE_AFTER": 10,
    "SHUTDOWN_GRACE": 5,
    "CONCURRENCY": 4,
    "ASYNC_CONCURRENCY": 4,
}
STEPS = 2
# How a statement the standby refused during recovery shows in its log (UPDATE, SELECT
# FOR UPDATE, LISTEN: all SQLSTATE 25006).
REFUSED = ("in a read-only transaction", "during recovery")

ENQUEUE = """
from nexus_workflows import enqueue_many
enqueue_many({kind!r}, [
    {{"key": str(n), "ledger": {ledger!r}, "seconds": 0.2, "steps": {steps}, "step_seconds": 0.05}}
    for n in range({items})
])
"""


def execute(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:  # ALTER SYSTEM: no transaction
        for statement in statements:
            connection.execute(statement)


def replicate_synchronously(primary: PrivatePostgres) -> None:
    """Once the standby streams, every commit on the primary waits for it. Set by ALTER
    SYSTEM after the base backup: the standby's copy of the setting would make it, once
    promoted, wait for a standby of its own that does not exist."""
    sync = "SELECT 1 FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'"
    wait_for(
        lambda: query(primary.url(), "SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'"),
        timeout=30,
        what="the standby to stream",
    )
    execute(primary.url(), "ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()")
    wait_for(lambda: query(primary.url(), sync), timeout=30, what="synchronous replication")


@pytest.fixture
def standby(private_postgres: PrivatePostgres) -> Iterator[PrivatePostgres]:
    server = PrivatePostgres(standby_of=private_postgres)
    try:
        server.start()
        replicate_synchronously(private_postgres)
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def proxy(private_postgres: PrivatePostgres) -> Iterator[TcpProxy]:
    """In front of the primary, until the test moves it."""
    proxy = TcpProxy("127.0.0.1", private_postgres.port)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.close()


def refusals(server: PrivatePostgres) -> int:
    """Statements the server refused because it was read-only (its log's ERROR lines; a
    STATEMENT line may quote the text too, in the last_error a release writes)."""
    log = server.log.read_text(errors="replace") if server.log.exists() else ""
    return sum(1 for line in log.splitlines() if "ERROR:" in line and any(text in line for text in REFUSED))


# A sync prepare (its saves on journal writers, from worker threads) and an async one.
@pytest.mark.parametrize("kind", ["test-interval", "test-interval-async"])
def test_a_failover_to_a_hot_standby_is_one_outage_that_costs_no_attempt(
    private_postgres: PrivatePostgres,
    standby: PrivatePostgres,
    proxy: TcpProxy,
    tmp_path: Path,
    report_figures: Callable[[str], None],
    kind: str,
) -> None:
    primary = private_postgres
    primary.create_database(DATABASE)
    ledger = tmp_path / "ledger"
    run_to_end("migrate", "--no-input", "-v", "0", url=primary.url(DATABASE))
    enqueue = ENQUEUE.format(kind=kind, ledger=str(ledger), steps=STEPS, items=ITEMS)
    run_to_end("shell", "-c", enqueue, url=primary.url(DATABASE))
    through_proxy = f"postgres://postgres@127.0.0.1:{proxy.port}/{DATABASE}"
    standby_url = standby.url(DATABASE)
    runner = ManagePy("runworkflows", "--kind", kind, settings=SETTINGS, database_url=through_proxy)
    try:
        runner.wait_for_output("runner started", timeout=60)
        wait_for(lambda: done_count(primary.url(DATABASE)) >= ITEMS // 4, timeout=30, what="a quarter done")
        primary.stop()  # -m immediate: the primary's sessions end mid-statement
        done_at_failover = done_count(standby_url)
        proxy.retarget("127.0.0.1", standby.port)
        # More refusals than saves can be in flight (CONCURRENCY): the loop's, the
        # heartbeat's and the wake-up listener's statements meet the read-only standby too.
        wait_for(lambda: refusals(standby) >= 8, timeout=30, what="the standby to refuse the runner")
        refused_before_promotion = refusals(standby)
        standby.promote()
        wait_for(lambda: done_count(standby_url) == ITEMS, timeout=40, interval=0.2, what=f"all {ITEMS} done")
        alive = runner.process.poll() is None  # the process started above: same PID throughout
        exit_code = runner.terminate()
        output = runner.output()
    finally:
        runner.close()

    statuses = dict(query(standby_url, f"SELECT status, count(*) FROM {TABLE} GROUP BY status") or [])
    attempts = dict(query(standby_url, f"SELECT attempt, count(*) FROM {TABLE} GROUP BY attempt") or [])
    histories = [
        json.loads(h) if isinstance(h, str) else h
        for (h,) in query(standby_url, f"SELECT history FROM {TABLE}") or []
    ]
    entries = Counter((entry.get("outcome"), entry.get("reason")) for past in histories for entry in past)
    intervals = read_intervals(ledger)
    ends = Counter(interval.key for interval in intervals if interval.ended)
    starts = Counter(interval.key for interval in intervals)
    steps = Counter((interval.key, step) for interval in intervals for step in interval.steps)
    report_figures(
        f"failover ({kind}): {ITEMS} items, {done_at_failover} done when the primary died; "
        f"{refused_before_promotion} statements refused by the read-only standby before promotion; "
        f"statuses {statuses}; attempts {attempts}; history entries {dict(entries)}; "
        f"items started more than once {sum(1 for n in starts.values() if n > 1)}; "
        f"'database unavailable' log lines {output.count('database unavailable (')}"
    )
    assert alive, output
    assert exit_code == 0, output
    assert output.count("runner started") == 1, output
    assert statuses == {"done": ITEMS}, output  # none left processing, none abandoned
    assert attempts == {0: ITEMS}, output  # the failover consumed no attempt
    assert set(ends) == {str(n) for n in range(ITEMS)}
    assert [key for key, count in ends.items() if count > 1] == []  # none ran to the end twice
    assert [key for key, count in steps.items() if count > 1] == []  # no saved step ran again
    assert overlapping(intervals) == []  # no two executions of one item at once
    # Only outages in the histories: attempts released for them, claims lost unstarted.
    assert set(entries) <= {("released", "database unavailable"), ("lost", None)}, entries
    assert "database unavailable (" in output, output
    # What it says of items that met the outage: released for it, never failing; or, for
    # a claim whose answer was lost with the primary, reclaimed once it went stale (its
    # history's ("lost", None), attempt unchanged: see SETTINGS).
    item_line = re.compile(
        r"attempt 1 of 4: (started|done|failed \(\w+: database unavailable\); released, .+"
        r"|reclaimed from a runner that stopped heart-beating)$"
    )
    about_items = [line for line in output.splitlines() if f"{kind} #" in line]
    assert [line for line in about_items if not item_line.search(line)] == [], output
    assert [line for line in output.splitlines() if " ERROR " in line] == [], output
    assert "event loop of async prepares" not in output, output  # no prepare blocked it
    assert "database reachable again" in output, output
    assert "writing its outcome failed" not in output, output  # not the items' fault
    assert "runner loop error" not in output, output
    assert "Traceback" not in output, output

"""The harness the restart tests share: run runners against a private PostgreSQL, restart
it at given points of the drain, and read back what happened."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.servers import PrivatePostgres
from tests.processes import ManagePy, wait_for

TABLE = "nexus_workflows_deferredwork"


def query(url: str, sql: str) -> list[tuple[Any, ...]] | None:
    """Rows of ``sql`` on a fresh connection, or ``None`` while the server is away."""
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2) as connection:
            return connection.execute(sql).fetchall()
    except psycopg.Error:
        return None


def run_to_end(*args: str, url: str, timeout: float = 180) -> str:
    """Run one management command against ``url``; it must succeed. Its output."""
    process = ManagePy(*args, database_url=url)
    try:
        assert process.wait(timeout) == 0, process.output()
        return process.output()
    finally:
        process.close()


def midway_in(ledger: Path, pid: int) -> set[str]:
    """Keys whose attempt by process ``pid`` has saved a step and not ended (so its start
    is on record: a save writes it too), by the ledger's whole lines."""
    text = ledger.read_text() if ledger.exists() else ""
    midway: set[str] = set()
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break  # a line still being written
        line_pid, key, event, _ = line.split(" ")
        if int(line_pid) != pid:
            continue
        if event.startswith("step"):
            midway.add(key)
        elif event == "end":
            midway.discard(key)
    return midway


def ids_logged(output: str, kind: str, outcome: str) -> Counter[int]:
    """How often a runner's log says ``<kind> #<id> attempt n of m: <outcome>``, by id."""
    line = re.compile(rf"{re.escape(kind)} #(\d+) attempt \d+ of \d+: {re.escape(outcome)}")
    return Counter(int(match.group(1)) for text in output.splitlines() if (match := line.search(text)))


def outage_seconds(output: str) -> list[float]:
    """The lengths of the outages a runner's log reports ("database reachable again after Ns")."""
    return [float(seconds) for seconds in re.findall(r"database reachable again after ([\d.]+)s", output)]


def done_count(url: str) -> int:
    rows = query(url, f"SELECT count(*) FROM {TABLE} WHERE status = 'done'")
    return rows[0][0] if rows else -1


@dataclass
class Drain:
    """What a drain through restarts showed: how long it took, each restart as (mode,
    items done when it began, seconds the server was away), the runners' state at the end,
    and the rows' statuses and attempts."""

    seconds: float = 0.0
    outages: list[tuple[str, int, float]] = field(default_factory=list)
    alive: list[bool] = field(default_factory=list)
    exit_codes: list[int | None] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)

    def describe_outages(self) -> str:
        return "; ".join(
            f"restart -m {mode} at {at} done, server away {away:.2f}s" for mode, at, away in self.outages
        )


def drain_through_restarts(
    server: PrivatePostgres,
    url: str,
    *,
    items: int,
    restarts: Sequence[tuple[int, str]],
    runner_args: Sequence[str],
    settings: dict[str, Any],
    runners: int = 2,
) -> Drain:
    """Start ``runners`` runners (``manage.py`` + ``runner_args``) on ``url`` (a database of
    ``server``), restart the server with
    each ``(after this many done, mode)`` of ``restarts``, wait until all ``items`` are
    done, then stop the runners (SIGTERM) and read the table."""
    drain = Drain()
    processes = [ManagePy(*runner_args, settings=settings, database_url=url) for _ in range(runners)]
    try:
        for process in processes:
            process.wait_for_output("runner started", timeout=60)
        began = time.monotonic()
        for threshold, mode in restarts:
            wait_for(
                lambda t=threshold: done_count(url) >= t, timeout=120, interval=0.05, what=f"{threshold} done"
            )
            at = done_count(url)
            drain.outages.append((mode, at, server.restart(mode)))
        wait_for(lambda: done_count(url) == items, timeout=240, interval=0.2, what=f"all {items} items done")
        drain.seconds = time.monotonic() - began
        drain.alive = [process.process.poll() is None for process in processes]
        drain.exit_codes = [process.terminate(timeout=30) for process in processes]
        drain.outputs = [process.output() for process in processes]
    finally:
        for process in processes:
            process.close()
    drain.statuses = dict(query(url, f"SELECT status, count(*) FROM {TABLE} GROUP BY status") or [])
    drain.attempts = dict(query(url, f"SELECT attempt, count(*) FROM {TABLE} GROUP BY attempt") or [])
    return drain

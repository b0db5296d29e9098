"""Starting real ``manage.py`` processes against the test database."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from django.db import connection

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def database_url(settings_dict: dict[str, Any], *, port: int | None = None) -> str:
    """A DATABASE_URL for the database of a connection's ``settings_dict`` (during tests:
    the test database); ``port`` replaces its port (a proxy in front of it)."""
    if settings_dict["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{Path(settings_dict['NAME']).resolve()}"
    user = quote(settings_dict.get("USER") or "", safe="")
    password = quote(settings_dict.get("PASSWORD") or "", safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or "127.0.0.1"
    scheme, default_port = ("mysql", 3306) if "mysql" in settings_dict["ENGINE"] else ("postgres", 5432)
    port = port or settings_dict.get("PORT") or default_port
    return f"{scheme}://{credentials}{host}:{port}/{quote(settings_dict['NAME'], safe='')}"


def url_of_test_database(*, port: int | None = None) -> str:
    """DATABASE_URL of the database this test session runs on (the test database)."""
    return database_url(connection.settings_dict, port=port)


def wait_for(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.05, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


class ManagePy:
    """A ``python manage.py …`` subprocess whose output goes to a temporary file.

    Every instance is remembered until closed: ``close_leftovers`` (an autouse fixture
    in conftest.py) kills what a failed test left running, so that no live runner of one
    test claims the next test's work or shows in its counts."""

    _open: set[ManagePy] = set()

    def __init__(
        self,
        *args: str,
        settings: dict[str, Any] | None = None,
        database_url: str | None = None,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
    ) -> None:
        # Kept open for the process's lifetime; closed and removed by close().
        self.output_file = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="managepy-", suffix=".log", delete=False
        )
        full_env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url or url_of_test_database(),
            "NEXUS_WORKFLOWS_JSON": json.dumps(settings or {}),
            "PYTHONUNBUFFERED": "1",
            # A process that will not stop is sent SIGABRT (terminate): this prints every
            # thread's stack into its output first.
            "PYTHONFAULTHANDLER": "1",
            **(env or {}),
        }
        self._sigterm_sent = False
        ManagePy._open.add(self)
        self.process = subprocess.Popen(
            [*(prefix or []), sys.executable, "manage.py", *args],
            cwd=PROJECT_ROOT,
            env=full_env,
            stdout=self.output_file,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return Path(self.output_file.name).read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 30) -> None:
        wait_for(lambda: text in self.output() or self.process.poll() is not None, timeout=timeout, what=text)
        if text not in self.output():
            raise AssertionError(f"process exited without printing {text!r}:\n{self.output()}")

    def send_sigterm(self) -> None:
        """Ask the process to stop, once: a second SIGTERM means "stop now" to a runner."""
        if self.process.poll() is None and not self._sigterm_sent:
            self.process.send_signal(signal.SIGTERM)
            self._sigterm_sent = True

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, then its exit code; a process still running after ``timeout`` is
        aborted (its threads' stacks land in its output) and fails the test."""
        self.send_sigterm()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            raise AssertionError(
                f"pid {self.pid} still running {timeout}s after SIGTERM; its output:\n{self.output()}"
            ) from None

    def kill(self) -> None:
        self.process.kill()  # SIGKILL: no cleanup, no release
        self.process.wait(10)

    def wait(self, timeout: float = 60) -> int:
        return self.process.wait(timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.output_file.close()
        Path(self.output_file.name).unlink(missing_ok=True)
        ManagePy._open.discard(self)

    @classmethod
    def close_leftovers(cls) -> None:
        for process in list(cls._open):
            process.close()


@dataclass
class Interval:
    """One execution of one item by one process, from a ledger file: from its ``start``
    line to its last line (``end``, or the last ``tick`` before the process died)."""

    key: str
    pid: int
    start: float
    last: float
    ended: bool
    steps: list[str] = field(default_factory=list)  # journalled steps it completed


def read_intervals(path: Path) -> list[Interval]:
    intervals: list[Interval] = []
    open_ones: dict[tuple[str, int], Interval] = {}
    if not path.exists():
        return intervals
    for line in path.read_text().splitlines():
        pid_text, key, event, when_text = line.split(" ")
        pid, when = int(pid_text), float(when_text)
        if event == "start":
            interval = Interval(key, pid, when, when, False)
            open_ones[(key, pid)] = interval
            intervals.append(interval)
            continue
        interval = open_ones[(key, pid)]
        interval.last = max(interval.last, when)
        if event.startswith("step"):
            interval.steps.append(event)
        if event == "end":
            interval.ended = True
            del open_ones[(key, pid)]
    return intervals


def overlapping(intervals: list[Interval]) -> list[tuple[Interval, Interval]]:
    """Pairs of executions of one item that ran at the same time."""
    by_key: dict[str, list[Interval]] = {}
    for interval in intervals:
        by_key.setdefault(interval.key, []).append(interval)
    pairs = []
    for runs in by_key.values():
        runs.sort(key=lambda interval: interval.start)
        pairs.extend((a, b) for a, b in itertools.pairwise(runs) if b.start <= a.last)
    return pairs

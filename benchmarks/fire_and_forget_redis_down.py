"""How long ``enqueue`` of a fire-and-forget job takes to raise ``QueueUnavailable`` when
its Redis is down, by queue configuration and by the way Redis went down. Prints figures;
asserts nothing.

    .venv/bin/python benchmarks/fire_and_forget_redis_down.py [ROUNDS] [SCENARIO ...] [--only CONFIGURATION]

Scenarios (each on a private ``redis-server`` this script starts and stops by PID):

* ``refused``: nothing listens on the port (this script holds it bound, never listening);
* ``killed``: the process enqueued once (its client holds a pooled connection), then the
  server was killed (``SIGKILL``): connections are refused from then on;
* ``frozen``: the process enqueued once, then the server was stopped (``SIGSTOP``): the
  kernel still accepts connections, nothing answers; the queue's URL or client sets
  ``socket_timeout=1`` (without one a read waits for ever, retry or not). Capped at
  ``FROZEN_CAP`` seconds;
* ``frozen-untimed``: as ``frozen``, without a ``socket_timeout`` (redis-py's default):
  capped at ``UNTIMED_CAP`` seconds;
* ``unreachable`` and ``unreachable-untimed``: as the two above, and the stopped server's
  accept queue filled, so that a new connection's SYN is dropped (no answer, no refusal):
  a host gone from the network, to a client whose pooled connection went quiet. Capped at
  ``FROZEN_CAP`` seconds.

Queue configurations: ``url`` (``URL``: the app gives its client redis-py's default
retry), ``host`` (``HOST``/``PORT``: redis-py's default retry), ``host-no-retry``
(``REDIS_CLIENT_KWARGS`` ``retry=Retry(NoBackoff(), 0)``: what a ``URL`` queue was before
2026-12-06), and ``url-own-retry`` (``URL`` with ``REDIS_CLIENT_KWARGS``
``retry=Retry(NoBackoff(), 1)``: one resend).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
os.environ.pop("REDIS_URL", None)

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.test.utils import override_settings  # noqa: E402
from redis.backoff import NoBackoff  # noqa: E402
from redis.retry import Retry  # noqa: E402

from nexus_workflows import QueueUnavailable, enqueue  # noqa: E402
from tests.faults.servers import PrivateRedis  # noqa: E402
from tests.ports import refusing_port  # noqa: E402

LEDGER = "test-ff-ledger"
FROZEN_CAP = 600.0
UNTIMED_CAP = 60.0
CONFIGURATIONS = ("url", "host", "host-no-retry", "url-own-retry")


def queue_config(configuration: str, port: int, socket_timeout: float | None) -> dict[str, Any]:
    query = f"?socket_timeout={socket_timeout}" if socket_timeout else ""
    by_host: dict[str, Any] = {"HOST": "127.0.0.1", "PORT": port, "DB": 0}
    kwargs: dict[str, Any] = {"socket_timeout": socket_timeout} if socket_timeout else {}
    if configuration == "url":
        return {"URL": f"redis://127.0.0.1:{port}/0{query}"}
    if configuration == "url-own-retry":
        return {
            "URL": f"redis://127.0.0.1:{port}/0{query}",
            "REDIS_CLIENT_KWARGS": {"retry": Retry(NoBackoff(), 1)},
        }
    if configuration == "host-no-retry":
        kwargs["retry"] = Retry(NoBackoff(), 0)
    return {**by_host, "REDIS_CLIENT_KWARGS": kwargs}


def timed_enqueue(key: str, cap: float) -> tuple[float, str]:
    """Seconds until ``enqueue`` returned or raised, and what it did (capped at ``cap``)."""
    outcome: dict[str, str] = {}

    def call() -> None:
        try:
            outcome["what"] = f"returned {enqueue(LEDGER, {'key': key})!r:.20}"
        except QueueUnavailable:
            outcome["what"] = "QueueUnavailable"
        except Exception as error:  # noqa: BLE001 - reported, not raised
            outcome["what"] = type(error).__name__

    began = time.monotonic()
    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(cap)
    return time.monotonic() - began, outcome.get("what", f"still blocked after {cap:.0f} s")


def fill_accept_queue(port: int) -> list[socket.socket]:
    """Connections that fill a stopped server's accept queue (somaxconn at most), after
    which the kernel drops new SYNs; the last few are still connecting."""
    limit = int(Path("/proc/sys/net/core/somaxconn").read_text()) + 8
    fillers = []
    for _ in range(min(limit, 1100)):
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    return fillers


def one(configuration: str, scenario: str, number: int) -> tuple[float, str]:
    server = PrivateRedis()
    timeout = 1.0 if scenario in ("frozen", "unreachable") else None
    fillers: list[socket.socket] = []
    try:
        with contextlib.ExitStack() as held:
            if scenario == "refused":
                port = held.enter_context(refusing_port())  # bound, never listening: refused
            else:
                server.start()  # its port is known once it listens
                port = server.port
            queues = {"default": {**queue_config(configuration, port, timeout), "DEFAULT_TIMEOUT": 60}}
            with override_settings(RQ_QUEUES=queues):
                if scenario != "refused":
                    enqueue(LEDGER, {"key": f"warm-{number}"})  # a pooled connection from now on
                    assert server.process is not None
                    if scenario == "killed":
                        server.kill()
                    else:
                        os.kill(server.process.pid, signal.SIGSTOP)
                    if scenario.startswith("unreachable"):
                        fillers = fill_accept_queue(port)
                caps = {"frozen-untimed": UNTIMED_CAP, "refused": 120.0, "killed": 120.0}
                return timed_enqueue(f"down-{number}", caps.get(scenario, FROZEN_CAP))
    finally:
        for filler in fillers:
            filler.close()
        if server.process is not None and server.process.poll() is None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.cleanup()


def main() -> None:
    arguments = sys.argv[1:]
    configurations: tuple[str, ...] = CONFIGURATIONS
    if "--only" in arguments:
        at = arguments.index("--only")
        configurations = (arguments[at + 1],)
        del arguments[at : at + 2]
    rounds = int(arguments[0]) if arguments else 3
    scenarios = arguments[1:] or ["refused", "killed", "frozen", "frozen-untimed"]
    assert settings.RQ_QUEUES  # tests.settings: replaced per measurement
    print(f"load average at start: {os.getloadavg()}")
    for scenario in scenarios:
        for configuration in configurations:
            results = [one(configuration, scenario, number) for number in range(rounds)]
            seconds = [s for s, _ in results]
            outcomes = sorted({what for _, what in results})
            print(
                f"{scenario:8} {configuration:14}: median {statistics.median(seconds):6.2f} s "
                f"(min {min(seconds):.2f}, max {max(seconds):.2f}; {rounds} enqueues) -> "
                f"{', '.join(outcomes)}",
                flush=True,
            )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

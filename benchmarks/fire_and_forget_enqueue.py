"""How fast ``enqueue`` sends fire-and-forget jobs. Prints figures; asserts nothing.

    .venv/bin/python benchmarks/fire_and_forget_enqueue.py [N]

Measures, for N jobs of a no-op workflow: new jobs on a real Redis (one atomic Lua
script each), duplicates refused by that script, and the embedded mode (each job runs
through RQ at enqueue on the in-process fakeredis). It uses its own Redis database
(REDIS_BENCH_URL, default redis://127.0.0.1:6379/13), emptied before and after.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
os.environ["REDIS_TEST_URL"] = os.environ.get("REDIS_BENCH_URL", "redis://127.0.0.1:6379/13")
os.environ.pop("REDIS_URL", None)

import django  # noqa: E402

django.setup()

from django.test import override_settings  # noqa: E402

from nexus_workflows import enqueue, register  # noqa: E402
from nexus_workflows.fire_and_forget import get_queue  # noqa: E402
from nexus_workflows.fire_and_forget.embedded import embedded_queue  # noqa: E402


def noop(trigger: dict[str, int]) -> None:
    pass


def timed(label: str, count: int, send: Callable[[int], object]) -> None:
    started = time.perf_counter()
    for number in range(count):
        send(number)
    elapsed = time.perf_counter() - started
    rate, each = count / elapsed, elapsed / count * 1e6
    print(f"{label:<44} {count:>6} in {elapsed:6.3f}s  {rate:8.0f}/s  {each:7.0f} µs each")


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    register("bench-noop", dedupe_key=lambda trigger: str(trigger["n"]), prepare=noop)
    connection = get_queue("default").connection
    print(
        f"Redis {connection.connection_pool.connection_kwargs.get('host')}:"
        f"{connection.connection_pool.connection_kwargs.get('port')}, rq default queue, {count} jobs"
    )
    connection.flushdb()
    timed("(for scale: one Redis PING round trip)", count, lambda n: connection.ping())
    try:
        timed("new jobs (unique enqueue), real Redis", count, lambda n: enqueue("bench-noop", {"n": n}))
        timed("duplicates (refused), real Redis", count, lambda n: enqueue("bench-noop", {"n": n}))
    finally:
        connection.flushdb()
    with override_settings(RQ_QUEUES={"default": embedded_queue()}):
        timed("embedded: enqueue + run through RQ at once", count, lambda n: enqueue("bench-noop", {"n": n}))
        timed("embedded: duplicates (refused)", count, lambda n: enqueue("bench-noop", {"n": n}))


if __name__ == "__main__":
    main()

"""How long one ``enqueue`` takes when it meets a backlog of cancelled jobs to sweep. Prints
figures; asserts nothing.

    .venv/bin/python benchmarks/fire_and_forget_sweep_backlog.py [BACKLOG] [ROUNDS]

Each round makes BACKLOG workflow jobs, cancels them, lets them pass a 2 s horizon, then
times the enqueue that sweeps (the first after the interval), the enqueues until the backlog
is gone, and one more with nothing to sweep. It uses its own Redis database
(REDIS_BENCH_URL, default redis://127.0.0.1:6379/13), emptied before and after.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
os.environ["REDIS_TEST_URL"] = os.environ.get("REDIS_BENCH_URL", "redis://127.0.0.1:6379/13")
os.environ.pop("REDIS_URL", None)

import django  # noqa: E402

django.setup()

from django.test import override_settings  # noqa: E402
from rq.registry import CanceledJobRegistry  # noqa: E402

from nexus_workflows import enqueue, register  # noqa: E402
from nexus_workflows.fire_and_forget import get_queue  # noqa: E402


def noop(trigger: dict[str, int]) -> None:
    pass


def workflows(retention: int) -> override_settings:
    from django.conf import settings

    return override_settings(NEXUS_WORKFLOWS={**settings.NEXUS_WORKFLOWS, "RETENTION": retention})


def one_round(backlog: int, round_number: int) -> tuple[float, int, float, float]:
    """The sweeping enqueue's seconds, the enqueues until the backlog was gone, the slowest of
    them, and an enqueue's with nothing left."""
    queue = get_queue("default")
    connection = queue.connection
    connection.flushdb()
    registry = CanceledJobRegistry(queue=queue)
    with workflows(3600):
        for number in range(backlog):
            job_id = enqueue("bench-sweep", {"n": f"{round_number}-{number}"})
            assert job_id is not None
            queue.fetch_job(job_id).cancel()
    latest = max(score for _, score in connection.zrange(registry.key, 0, -1, withscores=True))
    while (lambda now: now[0] + now[1] / 1e6)(connection.time()) < latest + 3:
        time.sleep(0.05)
    timings: list[float] = []
    with workflows(2):
        while registry.count and len(timings) < backlog:
            started = time.perf_counter()
            enqueue("bench-sweep", {"n": f"{round_number}-after-{len(timings)}"})
            timings.append(time.perf_counter() - started)
        started = time.perf_counter()
        enqueue("bench-sweep", {"n": f"{round_number}-quiet"})
        quiet = time.perf_counter() - started
    return timings[0], len(timings), max(timings), quiet


def main() -> None:
    backlog = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    register("bench-sweep", dedupe_key=lambda trigger: str(trigger["n"]), prepare=noop)
    connection = get_queue("default").connection
    print(f"backlog of {backlog} cancelled jobs, {rounds} rounds; load {os.getloadavg()[0]:.2f}")
    try:
        results = [one_round(backlog, number) for number in range(rounds)]
    finally:
        connection.flushdb()
    for first, count, slowest, quiet in results:
        print(
            f"sweeping enqueue {first * 1000:8.1f} ms; {count} enqueue(s) to clear it, slowest "
            f"{slowest * 1000:6.1f} ms; one with nothing to sweep {quiet * 1000:5.2f} ms"
        )
    print(f"median sweeping enqueue {statistics.median(r[0] for r in results) * 1000:.1f} ms")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

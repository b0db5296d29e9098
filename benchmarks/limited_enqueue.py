"""What a single ``enqueue`` of a kind with flow limits costs against a plain kind's, on
PostgreSQL. Prints figures; asserts nothing.

    DATABASE_URL=postgres://…/nx_bench .venv/bin/python benchmarks/limited_enqueue.py [ROUNDS] [CALLS]

Rounds of CALLS single enqueues each (autocommit, a new key each), alternating the kinds
in every round: a plain kind, a kind with ``rate_limit`` that no runner rests, and (where
the code has rest locks) the same while another session holds its rest lock as a busy
runner resting it does, so the trigger sends a NOTIFY. Medians of the rounds' µs per call.
Migrates the database it is given first; run it on a database of its own.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPOSITORY))
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from nexus_workflows import enqueue  # noqa: E402
from nexus_workflows.deferred.registry import registry  # noqa: E402
from nexus_workflows.models import DeferredWork  # noqa: E402
from nexus_workflows.sql import postgresql  # noqa: E402


def noop(trigger: object, checkpoints: object, save: object) -> None:
    pass


def per_call(calls: int, send: Callable[[int], object]) -> float:
    started = time.perf_counter()
    for number in range(calls):
        send(number)
    return (time.perf_counter() - started) / calls * 1e6


def raw_connection() -> object:
    import psycopg

    params = dict(connection.get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    return psycopg.connect(**params, autocommit=True)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    calls = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    assert connection.vendor == "postgresql", "PostgreSQL only: the NOTIFY is what is measured"
    call_command("migrate", verbosity=0)
    registry.register("bench-plain", dedupe_key=lambda t: str(t["n"]), prepare=noop, retry_schedule=[1])
    registry.register(
        "bench-limited",
        dedupe_key=lambda t: str(t["n"]),
        prepare=noop,
        retry_schedule=[1],
        rate_limit=(100, 1),
    )
    DeferredWork.objects.filter(kind__startswith="bench-").delete()
    resting = raw_connection() if hasattr(postgresql, "hold_rest_lock") else None
    figures: dict[str, list[float]] = {}
    serial = iter(range(10**9))

    def measure(label: str, kind: str) -> None:
        figures.setdefault(label, []).append(per_call(calls, lambda n: enqueue(kind, {"n": next(serial)})))

    for _ in range(rounds):
        measure("plain kind", "bench-plain")
        measure("limited kind, no runner rests it", "bench-limited")
        if resting is not None:
            postgresql.hold_rest_lock(resting, "bench-limited", lock_timeout=5)
            measure("limited kind, a runner rests it (NOTIFY)", "bench-limited")
            postgresql.release_rest_lock(resting, "bench-limited")
    plain = statistics.median(figures["plain kind"])
    print(f"{rounds} rounds of {calls} single enqueues each, median µs per call:")
    for label, values in figures.items():
        median = statistics.median(values)
        print(f"  {label:<44} {median:8.0f} µs  ({median / plain - 1:+.1%} vs plain)")
    DeferredWork.objects.filter(kind__startswith="bench-").delete()


if __name__ == "__main__":
    main()

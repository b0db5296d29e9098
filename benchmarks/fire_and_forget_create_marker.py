"""What a dedupe marker written by the job's atomic create would cost per enqueue. Prints
figures; asserts nothing.

    .venv/bin/python benchmarks/fire_and_forget_create_marker.py [CREATES] [ROUNDS]

A marker key per job (``<job key>:created-by``, holding the enqueue call's mark, with a TTL)
would let a create that redis-py sends again after a lost answer know its own job even
after the job ran and was deleted. The app does not write one (see the README's "A lost
answer"); this measures the price: RQ's own unique-create script against the same script
that also reads and writes the marker, with the arguments of a real workflow job, and the
marker's memory. It uses its own Redis database (REDIS_BENCH_URL, default
redis://127.0.0.1:6379/13), emptied before and after.
"""

from __future__ import annotations

import json
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

from rq.scripts import UNIQUE_ENQUEUE_SCRIPT, _build_hset_args  # noqa: E402

from nexus_workflows.fire_and_forget import get_queue  # noqa: E402
from nexus_workflows.fire_and_forget.job import RUN_SEALED_JOB  # noqa: E402
from nexus_workflows.fire_and_forget.sealing import seal_trigger  # noqa: E402

# RQ's script with a marker: KEYS[3] the marker, ARGV[4] its TTL, ARGV[5] the call's mark;
# the job's fields follow from ARGV[6] on. A create sent again that finds its own marker
# answers 2 (made by this call) and creates nothing.
MARKED_SCRIPT = """
    if redis.call("GET", KEYS[3]) == ARGV[5] then
        return 2
    end
    if redis.call("EXISTS", KEYS[1]) == 1 then
        return 0
    end
    redis.call("HSET", KEYS[1], unpack(ARGV, 6))
    redis.call("SET", KEYS[3], ARGV[5], "EX", tonumber(ARGV[4]))
    if ARGV[2] == "R" then
        redis.call("RPUSH", KEYS[2], ARGV[1])
    end
    return 1
"""


def job_arguments(number: int) -> tuple[str, list[str]]:
    """A workflow job's key and RQ's HSET arguments for it, as RQ's create builds them."""
    queue = get_queue("default")
    job_id = f"bench-marker__{number}"
    job = queue.create_job(
        RUN_SEALED_JOB,
        args=("bench-marker", seal_trigger(job_id, json.dumps({"key": number}))),
        job_id=job_id,
        meta={"nexus_enqueue_call": "f" * 32},
        result_ttl=86400,
        failure_ttl=86400,
        description="workflow bench-marker",
    )
    queue._prepare_for_queue(job)
    return job.key, _build_hset_args(job)


def one_round(creates: int, marked: bool) -> tuple[list[float], int]:
    """Each create's seconds, and the bytes the creates added to Redis's memory."""
    queue = get_queue("default")
    connection = queue.connection
    connection.flushdb()
    before = connection.info("memory")["used_memory"]
    script = connection.register_script(MARKED_SCRIPT if marked else UNIQUE_ENQUEUE_SCRIPT)
    prepared = [job_arguments(number) for number in range(creates)]
    seconds = []
    for key, fields in prepared:
        if marked:
            keys, args = [key, queue.key, f"{key}:created-by"], [key, "R", -1, 600, "f" * 32, *fields]
        else:
            keys, args = [key, queue.key], [key, "R", -1, *fields]
        began = time.perf_counter()
        script(keys=keys, args=args)
        seconds.append(time.perf_counter() - began)
    return seconds, connection.info("memory")["used_memory"] - before


def main() -> None:
    creates = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    connection = get_queue("default").connection
    try:
        for round_number in range(rounds):
            for marked in (False, True):
                seconds, used = one_round(creates, marked)
                print(
                    f"round {round_number + 1} {'with marker' if marked else 'RQ only    '}: "
                    f"median {statistics.median(seconds) * 1e6:.0f} µs, "
                    f"p95 {statistics.quantiles(seconds, n=20)[18] * 1e6:.0f} µs per create; "
                    f"used_memory {used / creates:.0f} B per job"
                )
        connection.flushdb()
        one_round(1, marked=True)
        marker = connection.memory_usage("rq:job:bench-marker__0:created-by")
        print(f"one marker key: {marker} B (MEMORY USAGE)")
    finally:
        connection.flushdb()


if __name__ == "__main__":
    main()

"""The benchmark's tasks: sync functions, like ``prepare`` of ours (Procrastinate runs a
sync task in a worker thread; an ``async def`` task would run on its event loop)."""

from __future__ import annotations

import asyncio
import time

from django.db import connection
from procrastinate.contrib.django import app

PROBE_TABLE = "bench_probe"


@app.task(name="bench_noop")
def noop(key: str) -> None:
    """Does nothing: the benchmark measures the machinery around it."""


@app.task(name="bench_stamp")
def stamp(key: str) -> None:
    """Records the moment it started in a side table (Procrastinate keeps no return value)."""
    started = time.time()
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {PROBE_TABLE} (key, started) VALUES (%s, %s)", [key, started])


# The I/O workload (benchmarks/io_workload.py): each job waits IO_WAIT seconds, as a call
# out over the network would; a sync task runs in a worker thread, an async one on the
# worker's event loop.
IO_WAIT = 0.2


@app.task(name="bench_io_sync")
def io_sync(key: str) -> None:
    time.sleep(IO_WAIT)


@app.task(name="bench_io_async")
async def io_async(key: str) -> None:
    await asyncio.sleep(IO_WAIT)

"""Threads that start together: the harness of the tests that race N callers."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from django.db import connections

T = TypeVar("T")


def run_together(target: Callable[[int], T], count: int, *, timeout: float = 30) -> list[T]:
    """Call ``target(0)`` … ``target(count - 1)`` in ``count`` threads released at once
    (a barrier), and return their results in that order.

    Each thread closes its database connections when done. An exception in any thread is
    raised here (the first one), as is a thread still running after ``timeout``.
    """
    barrier = threading.Barrier(count)
    results: dict[int, T] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            barrier.wait(timeout)
            results[index] = target(index)
        except BaseException as error:  # noqa: BLE001 - raised in the test's thread below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if errors:
        raise errors[0]
    running = sum(thread.is_alive() for thread in threads)
    if running:
        raise AssertionError(f"{running} of {count} threads still running after {timeout}s")
    return [results[index] for index in range(count)]

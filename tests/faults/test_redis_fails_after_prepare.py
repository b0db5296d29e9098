"""Fault suite: a private ``redis-server`` that refuses writes (out of memory under
``noeviction``) from the moment a requeued job's ``prepare`` returns until RQ records the
outcome. Only the job's own write in between fails: removing its earlier run's sealed
error. The job is recorded as finished (its work was done), not failed; the failed write
is logged by type, without the trigger."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

import pytest
import redis
from rq import SimpleWorker
from rq.job import JobStatus
from rq.registry import FailedJobRegistry

from nexus_workflows import enqueue
from nexus_workflows.fire_and_forget import get_queue
from nexus_workflows.fire_and_forget.job import SEALED_ERROR, error_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgresql,  # once per CI run: the fault suite runs on the PostgreSQL leg
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]

PATIENT = "María López"
runs: list[str] = []


def refuse_writes(client: redis.Redis) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")


def accept_writes(client: redis.Redis) -> None:
    client.config_set("maxmemory", "0")


def fails_then_fills_redis(trigger: dict[str, Any]) -> None:
    """The first run fails (its error is sealed into the job); the second succeeds, and
    Redis refuses writes from then on."""
    runs.append(trigger["key"])
    if len(runs) == 1:
        raise ValueError(f"no chart for {trigger['name']}")
    refuse_writes(redis.Redis.from_url(trigger["redis"]))


def burst(client: redis.Redis, *, writes_back_before_outcome: bool = False) -> None:
    """One in-process RQ worker in burst mode. With ``writes_back_before_outcome``, Redis
    takes writes again just before RQ records the job's outcome (success or failure)."""

    class Worker(SimpleWorker):
        def _finalize_success(self, *args: Any, **kwargs: Any) -> Any:
            if writes_back_before_outcome:
                accept_writes(client)
            return super()._finalize_success(*args, **kwargs)

        def _finalize_failure(self, *args: Any, **kwargs: Any) -> Any:
            if writes_back_before_outcome:
                accept_writes(client)
            return super()._finalize_failure(*args, **kwargs)

    queue = get_queue("default")
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        Worker([queue], connection=queue.connection).work(burst=True, logging_level="WARNING")
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


def test_a_requeued_job_whose_earlier_error_cannot_be_removed_is_still_finished(
    private_redis_client: redis.Redis,
    register_workflow: Callable[..., Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    runs.clear()
    workflow = register_workflow(fails_then_fills_redis)
    url = private_redis_client.connection_pool.connection_kwargs
    trigger = {"key": "r1", "name": PATIENT, "redis": f"redis://{url['host']}:{url['port']}/0"}
    job_id = enqueue(workflow.kind, trigger)
    queue = get_queue("default")
    burst(private_redis_client)
    assert SEALED_ERROR in queue.fetch_job(job_id).meta
    FailedJobRegistry(queue=queue).requeue(job_id)  # what django-rq's "Requeue" does

    with caplog.at_level(logging.DEBUG):
        burst(private_redis_client, writes_back_before_outcome=True)

    assert runs == ["r1", "r1"]  # run once more, not again
    job = queue.fetch_job(job_id)
    assert job.get_status() == JobStatus.FINISHED, job.latest_result().exc_string
    assert SEALED_ERROR in job.meta  # the write that failed: its earlier error is still there
    assert error_of(job) is None  # but the reveal page shows none for a finished job
    (said,) = [r for r in caplog.records if "could not be removed" in r.getMessage()]
    assert said.levelname == "ERROR"
    assert "(OutOfMemoryError)" in said.getMessage()  # by type: no message, no trigger
    assert all(PATIENT not in r.getMessage() for r in caplog.records)

"""A cancelled fire-and-forget job whose key is never enqueued again does not stay in Redis
for ever: enqueues on its queue sweep cancelled workflow jobs past the horizon, and leave
every other job alone (against the real Redis, REDIS_TEST_URL)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from rq.job import JobStatus
from rq.queue import Queue
from rq.registry import CanceledJobRegistry

from nexus_workflows import enqueue
from nexus_workflows.fire_and_forget import get_queue
from nexus_workflows.fire_and_forget.cancelled import SWEEP_BATCH, _passes, sweep_cancelled
from tests.processes import wait_for

LEDGER = "test-ff-ledger"


@pytest.fixture
def queue(rq_redis: redis.Redis) -> Queue:
    return get_queue("default")


def redis_now(queue: Queue) -> float:
    seconds, microseconds = queue.connection.time()
    return seconds + microseconds / 1e6


def wait_for_redis_time(queue: Queue, at_least: float, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while redis_now(queue) < at_least:
        assert time.monotonic() < deadline, "timed out waiting for Redis's clock"
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_an_enqueue_of_another_key_deletes_a_workflow_job_cancelled_past_the_horizon(
    queue: Queue, settings: Any
) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 2}
    cancelled = enqueue(LEDGER, {"key": "never-again"})
    assert cancelled is not None
    # Jobs that are not a workflow's, cancelled too: one whose id looks like a workflow's.
    others = [
        queue.enqueue_call("builtins.print", job_id="someone-elses-job"),
        queue.enqueue_call("builtins.print", job_id=f"{LEDGER}__look-alike"),
    ]
    for job in [queue.fetch_job(cancelled), *others]:
        job.cancel()
    registry = CanceledJobRegistry(queue=queue)
    # RQ records the cancel in whole seconds (rounded down): one more second is waited.
    cancelled_at = queue.connection.zscore(registry.key, cancelled)
    assert cancelled_at is not None
    wait_for_redis_time(queue, cancelled_at + 3)

    assert enqueue(LEDGER, {"key": "another"}) is not None

    assert queue.fetch_job(cancelled) is None
    assert not queue.connection.exists(queue.job_class.key_for(cancelled))
    assert sorted(registry.get_job_ids()) == sorted(job.id for job in others)
    for job in others:
        assert queue.fetch_job(job.id).get_status() == JobStatus.CANCELED


@pytest.mark.django_db(transaction=True)
def test_a_job_cancelled_within_the_horizon_is_not_swept(queue: Queue, settings: Any) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 3600}
    cancelled = enqueue(LEDGER, {"key": "recent"})
    assert cancelled is not None
    queue.fetch_job(cancelled).cancel()
    assert enqueue(LEDGER, {"key": "another"}) is not None
    assert queue.fetch_job(cancelled).get_status() == JobStatus.CANCELED
    assert enqueue(LEDGER, {"key": "recent"}) is None  # still holds its key


@pytest.mark.django_db(transaction=True)
def test_other_cancelled_jobs_ahead_in_the_registry_do_not_starve_the_sweep(
    queue: Queue, settings: Any
) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 2}
    # More than a page of other jobs, cancelled first: they come first in the registry.
    for number in range(150):
        queue.enqueue_call("builtins.print", job_id=f"a-job-of-the-project-{number}").cancel()
    cancelled = enqueue(LEDGER, {"key": "behind-them"})
    assert cancelled is not None
    queue.fetch_job(cancelled).cancel()
    registry = CanceledJobRegistry(queue=queue)
    cancelled_at = queue.connection.zscore(registry.key, cancelled)
    assert cancelled_at is not None
    wait_for_redis_time(queue, cancelled_at + 3)

    # An enqueue sweeps one page (SWEEP_BATCH entries, all the project's here); the next
    # enqueue takes the next page at once, past them.
    assert enqueue(LEDGER, {"key": "another"}) is not None
    assert queue.fetch_job(cancelled) is not None
    assert enqueue(LEDGER, {"key": "and-another"}) is not None

    assert queue.fetch_job(cancelled) is None
    assert len(registry.get_job_ids()) == 150


@pytest.mark.django_db(transaction=True)
def test_an_entry_naming_a_gone_workflow_job_is_removed_and_other_entries_are_left(
    queue: Queue, settings: Any
) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 2}
    gone = enqueue(LEDGER, {"key": "hash-gone"})
    assert gone is not None
    others = ["someone-elses-gone-job", f"{LEDGER}__still-there"]
    queue.enqueue_call("builtins.print", job_id=others[1])
    for job_id in [gone, *others[1:]]:
        queue.fetch_job(job_id).cancel()
    registry = CanceledJobRegistry(queue=queue)
    queue.connection.zadd(registry.key, {others[0]: queue.connection.zscore(registry.key, gone)})
    # The hashes go, as a flush of keys or a TTL set by hand would take them; the entries stay.
    queue.connection.delete(queue.job_class.key_for(gone), queue.job_class.key_for(others[0]))
    cancelled_at = max(score for _, score in queue.connection.zrange(registry.key, 0, -1, withscores=True))
    wait_for_redis_time(queue, cancelled_at + 3)

    assert enqueue(LEDGER, {"key": "another"}) is not None

    # Only the workflow job id's entry goes: the other id is not the app's to clean up, and
    # the look-alike's job is there (not a workflow's: its description says so).
    assert sorted(registry.get_job_ids()) == sorted(others)


@pytest.mark.django_db(transaction=True)
def test_an_entry_a_page_skips_after_removals_ahead_of_it_is_swept_by_the_next_pass(queue: Queue) -> None:
    """Guard: a pass's cursor counts the entries it left; when another process removes some of
    them, the next page starts past entries it never read. The next pass starts at the top."""
    horizon = 2
    project_jobs = [
        queue.enqueue_call("builtins.print", job_id=f"a-job-of-the-project-{number}")
        for number in range(SWEEP_BATCH)
    ]
    for job in project_jobs:
        job.cancel()
    skipped = enqueue(LEDGER, {"key": "skipped-once"})
    assert skipped is not None
    queue.fetch_job(skipped).cancel()
    registry = CanceledJobRegistry(queue=queue)
    cancelled_at = queue.connection.zscore(registry.key, skipped)
    assert cancelled_at is not None
    wait_for_redis_time(queue, cancelled_at + horizon + 1)
    _passes.pop(queue.name, None)  # this process starts a new pass

    assert sweep_cancelled(queue, horizon) == 0  # the first page: the project's jobs, left
    for job in project_jobs:  # another process deletes them: the skipped job moves up
        job.delete()
    assert sweep_cancelled(queue, horizon) == 0  # the next page starts past it: the pass ends
    assert queue.fetch_job(skipped) is not None

    wait_for(lambda: sweep_cancelled(queue, horizon) == 1, timeout=30, what="the next pass")
    assert queue.fetch_job(skipped) is None
    assert registry.get_job_ids() == []

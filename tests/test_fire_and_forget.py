"""Fire-and-forget workflows on django-rq, against the real Redis (REDIS_TEST_URL).

Executions are counted in the ``Ledger`` table, which worker subprocesses write too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import subprocess
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.urls import reverse
from redis.backoff import NoBackoff
from redis.retry import Retry
from rq.command import send_stop_job_command
from rq.job import JobStatus, validate_job_id
from rq.queue import Queue
from rq.registry import CanceledJobRegistry, FailedJobRegistry, ScheduledJobRegistry

from nexus_workflows import (
    InvalidEnqueueOption,
    QueueUnavailable,
    SealedDataUnreadable,
    enqueue,
    enqueue_many,
)
from nexus_workflows.deferred.registry import registry
from nexus_workflows.fire_and_forget import get_queue, job_id_for, run_job, split_job_id
from nexus_workflows.fire_and_forget.job import SEALED_ERROR
from nexus_workflows.fire_and_forget.sealing import open_error, open_trigger
from nexus_workflows.fire_and_forget.sending import URL_QUEUE_RETRIES
from nexus_workflows.models import DeferredWork
from nexus_workflows.phi import PhiConfigurationError
from tests.conftest import PYTHON, REPOSITORY
from tests.loopback import LoopbackListener
from tests.testapp.models import Ledger

LEDGER = "test-ff-ledger"
FAIL = "test-ff-fail"


def executions(kind: str = LEDGER, key: str | None = None) -> int:
    rows = Ledger.objects.filter(kind=kind)
    return (rows.filter(key=key) if key is not None else rows).count()


def wait_until(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def stored_job_bytes(queue: Queue, job_id: str) -> bytes:
    """Every field of the job's hash in Redis, its pickled call decompressed."""
    fields = queue.connection.hgetall(queue.job_class.key_for(job_id))
    return b"|".join([*fields.values(), zlib.decompress(fields[b"data"])])


@pytest.fixture
def queue(rq_redis: redis.Redis) -> Queue:
    return get_queue("default")


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog that also sees nexus_workflows, whose logger does not propagate in the
    project's LOGGING."""
    logger = logging.getLogger("nexus_workflows")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


# --- job ids --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "job_id"),
    [
        ("123", "k__123"),
        ("550e8400-e29b-41d4-a716-446655440000", "k__550e8400-e29b-41d4-a716-446655440000"),
        ("visit_7", "k__visit_7"),
        ("a__b", "k__a__b"),
        ("visit/7", "k__-visit-2f7"),
        ("-5", "k__--2d5"),
        ("_x", "k__-_x"),
        ("a b:c-d", "k__-a-20b-3ac-2dd"),
        ("ñ", "k__--c3-b1"),
    ],
)
def test_job_id_is_kind_and_key_escaping_what_rq_does_not_allow(key: str, job_id: str) -> None:
    assert job_id_for("k", key) == job_id
    validate_job_id(job_id)  # RQ accepts it
    assert split_job_id(job_id) == ("k", key)


def test_job_ids_never_collide_and_always_split_back() -> None:
    kinds = ["a", "a_", "a-", "a_b", "a-_"]
    keys = ["b", "_b", "__b", "-b", "b_", "b__c", "x y", "-2d", "-", "_", "ß/€", "a" * 255, "\U0001f600"]
    ids = {job_id_for(kind, key): (kind, key) for kind in kinds for key in keys}
    assert len(ids) == len(kinds) * len(keys)
    for job_id, pair in ids.items():
        validate_job_id(job_id)
        assert split_job_id(job_id) == pair


@pytest.mark.parametrize("job_id", ["nokind", "__x", "k__-zz", "k__-a-2", "k__ab c", "k__-a.b"])
def test_split_job_id_rejects_ids_it_cannot_have_made(job_id: str) -> None:
    with pytest.raises(ValueError, match="not a fire-and-forget job id"):
        split_job_id(job_id)


# --- running through RQ ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_enqueue_returns_the_job_id_and_a_worker_runs_prepare_once(
    queue: Queue, rq_burst: Callable[..., int], settings: Any
) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 3600}
    job_id = enqueue(LEDGER, {"key": "v1", "name": "Ana López"})

    assert job_id == "test-ff-ledger__v1"
    job = queue.fetch_job(job_id)
    assert job is not None
    assert job.get_status() == JobStatus.QUEUED
    assert (job.result_ttl, job.failure_ttl, job.ttl) == (3600, 3600, None)
    assert queue.connection.ttl(job.key) == -1  # a queued job never expires before it runs
    assert "Ana" not in job.description  # list pages and worker logs show the description
    assert "Ana" not in repr(job.args)  # django-rq's job page and RQ's failure log show these
    assert b"Ana" not in stored_job_bytes(queue, job_id)  # nor is it in Redis in clear
    assert executions() == 0

    assert rq_burst() == 1
    assert executions("test-ff-ledger", "v1") == 1
    job.refresh()
    assert job.get_status() == JobStatus.FINISHED
    assert 0 < queue.connection.ttl(job.key) <= 3600  # kept for RETENTION, the dedupe horizon
    assert rq_burst() == 0
    assert executions() == 1


@pytest.mark.django_db(transaction=True)
def test_duplicates_while_queued_and_after_finishing_return_none_and_add_no_execution(
    queue: Queue, rq_burst: Callable[..., int]
) -> None:
    job_id = enqueue(LEDGER, {"key": "v2"})
    assert enqueue(LEDGER, {"key": "v2", "other": "field"}) is None  # queued
    assert queue.job_ids == [job_id]

    assert rq_burst() == 1
    assert enqueue(LEDGER, {"key": "v2"}) is None  # finished, within the horizon
    assert rq_burst() == 0
    assert executions() == 1


@pytest.mark.django_db(transaction=True)
def test_duplicates_after_a_failure_return_none_and_add_no_execution(
    queue: Queue, rq_burst: Callable[..., int]
) -> None:
    job_id = enqueue(FAIL, {"key": "f1"})
    assert rq_burst() == 1
    assert job_id in FailedJobRegistry(queue=queue).get_job_ids()

    assert enqueue(FAIL, {"key": "f1"}) is None  # failed, within the horizon
    assert rq_burst() == 0
    assert executions(FAIL) == 1


@pytest.mark.django_db(transaction=True)
def test_a_failed_job_requeued_that_succeeds_no_longer_keeps_its_earlier_error(
    queue: Queue, rq_burst: Callable[..., int]
) -> None:
    job_id = enqueue(FAIL, {"key": "f2", "fail_runs": 1, "secret": "María López"})
    assert rq_burst() == 1
    assert SEALED_ERROR in queue.fetch_job(job_id).meta
    FailedJobRegistry(queue=queue).requeue(job_id)  # what django-rq's "Requeue" does
    assert rq_burst() == 1
    job = queue.fetch_job(job_id)
    assert job.get_status() == JobStatus.FINISHED, job.latest_result().exc_string
    assert SEALED_ERROR not in job.meta  # the reveal page says it has not failed
    assert executions(FAIL) == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", [LEDGER, FAIL])
def test_after_the_horizon_the_key_works_again(
    kind: str, queue: Queue, rq_burst: Callable[..., int], settings: Any
) -> None:
    # 3 s: the burst worker stops within rq's one-second join. The TTL -2 once seen here was
    # its stop waiting 60 s on redis 8.2.0 (tests/test_rq_worker_stop.py), not load.
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 3}
    job_id = enqueue(kind, {"key": "h"})
    assert rq_burst() == 1
    # Within the horizon: the finished or failed job's key lives for RETENTION seconds.
    ttl = queue.connection.ttl(queue.job_class.key_for(job_id))
    assert 0 < ttl <= 3
    assert enqueue(kind, {"key": "h"}) is None

    wait_until(lambda: not queue.connection.exists(queue.job_class.key_for(job_id)), "the job to expire")
    assert enqueue(kind, {"key": "h"}) == job_id
    assert rq_burst() == 1
    assert executions(kind, "h") == 2


def cancelled_at(queue: Queue, job_id: str) -> float:
    """When RQ's ``job.cancel()`` cancelled the job: its score in the canceled registry."""
    score = queue.connection.zscore(CanceledJobRegistry(queue=queue).key, job_id)
    assert score is not None, "the job is not in the canceled registry"
    return score


def redis_now(queue: Queue) -> float:
    seconds, microseconds = queue.connection.time()
    return seconds + microseconds / 1e6


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_transaction", [False, True])
def test_a_cancelled_job_keeps_its_key_for_the_horizon_after_the_cancel_then_frees_it(
    queue: Queue, rq_burst: Callable[..., int], settings: Any, in_transaction: bool
) -> None:
    # RQ records the cancel in whole seconds (rounded down): up to 1 s of the horizon goes.
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 3}
    job_id = enqueue(LEDGER, {"key": "c"})
    queue.fetch_job(job_id).cancel()  # code or an operator's shell; django-rq's pages cannot
    assert queue.fetch_job(job_id).get_status() == JobStatus.CANCELED
    # Within the horizon, like a finished, failed or stopped job: refused, nothing runs.
    with transaction.atomic() if in_transaction else nullcontext():
        assert enqueue(LEDGER, {"key": "c"}) is None
    assert rq_burst() == 0

    # RQ gives a cancelled job no TTL: without the rule its key would be taken for ever.
    assert queue.connection.ttl(queue.job_class.key_for(job_id)) == -1
    wait_until(lambda: redis_now(queue) >= cancelled_at(queue, job_id) + 3, "the horizon to pass")
    with transaction.atomic() if in_transaction else nullcontext():
        assert enqueue(LEDGER, {"key": "c", "again": True}) == job_id
    job = queue.fetch_job(job_id)
    assert job.get_status() == JobStatus.QUEUED
    assert open_trigger(job_id, job.args[1]) == {"key": "c", "again": True}
    # The cancelled job is gone with its entry in RQ's canceled registry.
    assert CanceledJobRegistry(queue=queue).get_job_ids() == []
    assert rq_burst() == 1
    assert executions(LEDGER, "c") == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_rqworker_runs_the_job_and_refuses_a_duplicate_while_it_runs(
    queue: Queue, rq_redis: redis.Redis, child_env: dict[str, str]
) -> None:
    job_id = enqueue(LEDGER, {"key": "run", "hold": True})
    # A real `manage.py rqworker` (forking worker): it knows test-ff-ledger only
    # through autodiscovery of tests.testapp.workflows.
    worker = subprocess.Popen(
        [PYTHON, "manage.py", "rqworker", "--burst", "default"],
        cwd=REPOSITORY,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until(
            lambda: rq_redis.exists("ff-test:started:run") or worker.poll() is not None,
            "prepare to start in the worker",
        )
        assert worker.poll() is None, worker.communicate()[0]
        assert queue.fetch_job(job_id).get_status() == JobStatus.STARTED
        assert enqueue(LEDGER, {"key": "run"}) is None  # running
        rq_redis.rpush("ff-test:release:run", "go")
        output, _ = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, output
    assert "default: workflow test-ff-ledger (test-ff-ledger__run)" in output
    assert "hold" not in output  # RQ logs the description, which holds no trigger data
    assert executions("test-ff-ledger", "run") == 1
    assert Ledger.objects.get().pid == int(rq_redis.get("ff-test:started:run"))  # ran in the worker
    assert queue.fetch_job(job_id).get_status() == JobStatus.FINISHED
    assert enqueue(LEDGER, {"key": "run"}) is None


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_job_missing_from_the_canceled_registry_is_held_from_when_enqueue_finds_it(
    queue: Queue, rq_burst: Callable[..., int], settings: Any
) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 2}
    job_id = enqueue(LEDGER, {"key": "u"})
    queue.fetch_job(job_id).cancel()
    queue.connection.zrem(CanceledJobRegistry(queue=queue).key, job_id)  # cancel time unknown
    before = redis_now(queue)
    assert enqueue(LEDGER, {"key": "u"}) is None
    assert before <= cancelled_at(queue, job_id) <= redis_now(queue)  # the horizon starts now
    wait_until(lambda: redis_now(queue) >= cancelled_at(queue, job_id) + 2, "the horizon to pass")
    assert enqueue(LEDGER, {"key": "u"}) == job_id
    assert rq_burst() == 1
    assert executions(LEDGER, "u") == 1


@pytest.mark.django_db(transaction=True)
def test_enqueues_racing_for_the_key_of_a_long_cancelled_job_make_one_job(
    queue: Queue, rq_burst: Callable[..., int], settings: Any
) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 1}
    job_id = enqueue(LEDGER, {"key": "r"})
    queue.fetch_job(job_id).cancel()
    wait_until(lambda: redis_now(queue) >= cancelled_at(queue, job_id) + 1, "the horizon to pass")
    start = threading.Barrier(8)

    def race(number: int) -> str | None:
        start.wait()
        return enqueue(LEDGER, {"key": "r", "number": number})

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(race, range(8)))
    assert sorted(results, key=str) == [None] * 7 + [job_id]
    winner = results.index(job_id)
    assert open_trigger(job_id, queue.fetch_job(job_id).args[1]) == {"key": "r", "number": winner}
    assert rq_burst() == 1
    assert executions(LEDGER, "r") == 1


@contextlib.contextmanager
def holding_worker(key: str, rq_redis: redis.Redis, child_env: dict[str, str]) -> Iterator[Any]:
    """A real forking ``manage.py rqworker --burst`` once ``prepare`` of the held job
    ``key`` (see tests.testapp.workflows.ff_ledger) has started in it; killed on the way
    out if it is still running."""
    worker = subprocess.Popen(
        [PYTHON, "manage.py", "rqworker", "--burst", "default"],
        cwd=REPOSITORY,
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    wait_until(
        lambda: rq_redis.exists(f"ff-test:started:{key}") or worker.poll() is not None,
        "prepare to start in the worker",
    )
    try:
        assert worker.poll() is None, worker.communicate()[0]
        yield worker
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_job_cancelled_while_it_runs_keeps_its_key_while_it_runs_past_the_horizon(
    queue: Queue, rq_redis: redis.Redis, child_env: dict[str, str], settings: Any
) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 1}
    job_id = enqueue(LEDGER, {"key": "cr", "hold": True})
    with holding_worker("cr", rq_redis, child_env) as worker:
        queue.fetch_job(job_id).cancel()  # RQ's cancel does not stop the work-horse
        assert queue.fetch_job(job_id).get_status() == JobStatus.CANCELED
        wait_until(lambda: redis_now(queue) >= cancelled_at(queue, job_id) + 1, "the horizon to pass")
        assert enqueue(LEDGER, {"key": "cr"}) is None  # prepare still runs: never two at once
        rq_redis.rpush("ff-test:release:cr", "go")
        output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, output
    assert executions(LEDGER, "cr") == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_job_stopped_while_it_runs_is_failed_and_keeps_its_key_for_the_horizon(
    queue: Queue, rq_redis: redis.Redis, child_env: dict[str, str], settings: Any
) -> None:
    settings.NEXUS_WORKFLOWS = {**settings.NEXUS_WORKFLOWS, "RETENTION": 60}
    job_id = enqueue(LEDGER, {"key": "st", "hold": True})
    with holding_worker("st", rq_redis, child_env) as worker:
        send_stop_job_command(rq_redis, job_id)  # what django-rq's Stop does
        output, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, output
    assert queue.fetch_job(job_id).get_status() == JobStatus.STOPPED
    assert job_id in FailedJobRegistry(queue=queue).get_job_ids()
    assert 0 < queue.connection.ttl(queue.job_class.key_for(job_id)) <= 60  # failure_ttl: RETENTION
    assert enqueue(LEDGER, {"key": "st"}) is None
    assert executions(LEDGER, "st") == 0  # the work-horse was killed before it recorded


ENQUEUE_AT_SIGNAL = """
import json, os, sys
import django
django.setup()
import redis
from django.conf import settings
from nexus_workflows import enqueue
control = redis.Redis.from_url(settings.REDIS_TEST_URL)
control.rpush("ff-test:ready", os.getpid())
if control.blpop(["ff-test:go"], timeout=60) is None:
    sys.exit("no start signal")
keys = [f"race-{number}" for number in range(int(sys.argv[1]))]
print(json.dumps([enqueue("test-ff-ledger", {"key": key}) for key in keys]))
"""


RACE_KEYS = 50


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_eight_processes_enqueueing_the_same_keys_at_once_make_one_execution_per_key(
    rq_redis: redis.Redis, rq_burst: Callable[..., int], child_env: dict[str, str]
) -> None:
    # Eight processes are released at the same instant and enqueue the same keys in the
    # same order, so every key is contended; a check-then-enqueue would lose some races.
    processes = [
        subprocess.Popen(
            [PYTHON, "-c", ENQUEUE_AT_SIGNAL, str(RACE_KEYS)],
            cwd=REPOSITORY,
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(8)
    ]
    try:

        def all_ready() -> bool:
            crashed = [process for process in processes if process.poll() not in (None, 0)]
            assert not crashed, crashed[0].communicate()[1]
            return rq_redis.llen("ff-test:ready") == len(processes)

        wait_until(all_ready, "eight processes to set Django up", timeout=90)
        # One token each: BLPOP releases all eight at once.
        rq_redis.rpush("ff-test:go", *["go"] * len(processes))
        results = []
        for process in processes:
            output, errors = process.communicate(timeout=60)
            assert process.returncode == 0, errors
            results.append(json.loads(output.strip().splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    for number in range(RACE_KEYS):
        per_process = [returned[number] for returned in results]
        assert per_process.count(f"test-ff-ledger__race-{number}") == 1, per_process
        assert per_process.count(None) == 7
    assert rq_burst() == RACE_KEYS
    assert Ledger.objects.filter(kind="test-ff-ledger").count() == RACE_KEYS
    assert Ledger.objects.values("key").distinct().count() == RACE_KEYS


# --- transactions ----------------------------------------------------------------------------


class Rollback(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_a_rolled_back_transaction_sends_nothing(
    queue: Queue, rq_burst: Callable[..., int]
) -> None:
    def enqueue_then_roll_back() -> None:
        with transaction.atomic():
            assert enqueue(LEDGER, {"key": "tx1"}) == "test-ff-ledger__tx1"
            assert queue.count == 0  # not before commit
            raise Rollback

    with pytest.raises(Rollback):
        enqueue_then_roll_back()
    assert queue.count == 0
    assert not queue.connection.exists(queue.job_class.key_for("test-ff-ledger__tx1"))
    assert rq_burst() == 0
    assert executions() == 0


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_a_committed_transaction_sends_one_job(queue: Queue, rq_burst: Callable[..., int]) -> None:
    with transaction.atomic():
        first = enqueue(LEDGER, {"key": "tx2"})
        again = enqueue(LEDGER, {"key": "tx2"})  # the same key twice in one transaction
        assert first == again == "test-ff-ledger__tx2"
        assert queue.count == 0
    assert queue.job_ids == ["test-ff-ledger__tx2"]
    assert rq_burst() == 1
    assert executions() == 1


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_found_at_commit_is_logged_and_dropped_without_raising(
    queue: Queue, rq_burst: Callable[..., int], logs: pytest.LogCaptureFixture
) -> None:
    with transaction.atomic():
        assert enqueue(LEDGER, {"key": "tx3", "from": "transaction"}) == "test-ff-ledger__tx3"
        # Meanwhile another caller, not in a transaction, sends the same key first.
        with ThreadPoolExecutor(1) as pool:
            assert pool.submit(enqueue, LEDGER, {"key": "tx3"}).result() == "test-ff-ledger__tx3"
    # The commit did not raise; the transaction's job was dropped.
    assert "test-ff-ledger job dropped at commit" in logs.text
    assert queue.job_ids == ["test-ff-ledger__tx3"]
    sealed = queue.fetch_job("test-ff-ledger__tx3").args[1]
    assert open_trigger("test-ff-ledger__tx3", sealed) == {"key": "tx3"}
    assert rq_burst() == 1
    assert executions() == 1


@pytest.mark.django_db(transaction=True)
def test_inside_a_transaction_an_existing_job_is_refused_at_once(queue: Queue) -> None:
    enqueue(LEDGER, {"key": "tx4"})
    with transaction.atomic():
        assert enqueue(LEDGER, {"key": "tx4"}) is None
        assert transaction.get_connection().run_on_commit == []
    assert queue.count == 1


@pytest.mark.django_db(transaction=True)
def test_without_phi_keys_enqueue_in_a_transaction_raises_at_once_and_sends_nothing(
    queue: Queue, settings: Any
) -> None:
    keyless = {k: v for k, v in settings.NEXUS_WORKFLOWS.items() if not k.startswith("PHI_")}
    settings.NEXUS_WORKFLOWS = keyless  # and DEBUG is off, as in every test
    with pytest.raises(PhiConfigurationError, match="PHI_HMAC_KEY"), transaction.atomic():
        enqueue(LEDGER, {"key": "tx5"})  # raises here, not in the commit's hook
    assert queue.count == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("in_transaction", [False, True])
def test_enqueue_many_gives_a_repeated_key_the_same_result_and_sends_it_once(
    queue: Queue, rq_burst: Callable[..., int], logs: pytest.LogCaptureFixture, in_transaction: bool
) -> None:
    triggers = [{"key": "m1", "first": True}, {"key": "m2"}, {"key": "m1"}]
    with transaction.atomic() if in_transaction else nullcontext():
        results = enqueue_many(LEDGER, triggers)
    # enqueue_many's rule: a key that appears twice gets the same result twice.
    assert results == ["test-ff-ledger__m1", "test-ff-ledger__m2", "test-ff-ledger__m1"]
    assert "dropped at commit" not in logs.text  # the repeat was not sent at all
    sealed = queue.fetch_job("test-ff-ledger__m1").args[1]
    assert open_trigger("test-ff-ledger__m1", sealed) == {"key": "m1", "first": True}  # the first wins
    assert rq_burst() == 2
    assert executions(LEDGER, "m1") == 1


# --- failures ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_failing_job_is_in_the_failed_registry_with_its_message_sealed_out_of_logs_and_pages(
    queue: Queue,
    rq_burst: Callable[..., int],
    logs: pytest.LogCaptureFixture,
    client: Any,
    django_user_model: Any,
) -> None:
    secret = "Ana López +525512345678"
    job_id = enqueue(FAIL, {"key": "f2", "secret": secret})
    assert rq_burst() == 1

    assert job_id in FailedJobRegistry(queue=queue).get_job_ids()
    job = queue.fetch_job(job_id)
    assert job.get_status() == JobStatus.FAILED
    assert (
        "JobFailed: workflow 'test-ff-fail': prepare raised UpstreamRejected"
        in job.latest_result().exc_string
    )
    assert "workflows.py" in job.latest_result().exc_string  # where it was raised
    assert secret not in job.latest_result().exc_string
    assert "error" not in job.meta  # only sealed, and it opens to the message
    message = open_error(job_id, job.meta["sealed_error"])
    assert message == f"UpstreamRejected: upstream rejected the message for {secret}"
    reveal = reverse("admin:nexus_workflows_deferredwork_job_reveal", args=["default", job_id])
    assert job.meta["reveal"] == reveal
    assert "exception raised while executing" in logs.text  # RQ's own failure log line...
    assert secret not in logs.text  # ...without the message
    # ...nor the trigger among its extra fields (RQ adds the job's arguments there, and a
    # JSON formatter prints every field): the arguments are sealed.
    failure = next(r for r in logs.records if "exception raised while executing" in r.getMessage())
    assert failure.arguments[0] == FAIL
    assert "+525512345678" not in repr(vars(failure))
    assert b"+525512345678" not in stored_job_bytes(queue, job_id)
    assert 0 < queue.connection.ttl(job.key) <= settings.NEXUS_WORKFLOWS.get("RETENTION", 86_400)

    # django-rq's pages (any staff user may open them) hold ciphertext and the way to the
    # reveal page, even for a superuser.
    admin = django_user_model.objects.create_superuser("triage", "triage@example.com", "password")
    client.force_login(admin)
    queue_index = sorted(settings.RQ_QUEUES).index("default")
    listing = client.get(reverse("admin:django_rq_failed_jobs", args=[queue_index]))
    assert listing.status_code == 200
    page = listing.content.decode()
    assert job_id in page
    assert "nexus_workflows.fire_and_forget.run_sealed_job" in page
    assert "+525512345678" not in page  # no trigger data on the list page
    detail = client.get(reverse("admin:django_rq_job_detail", args=[queue_index, job_id]))
    assert detail.status_code == 200
    assert "+525512345678" not in detail.content.decode()
    assert "upstream rejected the message" not in detail.content.decode()
    assert reveal in detail.content.decode()
    # RQ 3 keeps the traceback in the job's results, each with its own admin page.
    result_id = job.latest_result().id
    assert result_id in detail.content.decode()
    result = client.get(reverse("admin:django_rq_result_detail", args=[queue_index, job_id, result_id]))
    assert result.status_code == 200
    assert "prepare raised UpstreamRejected" in result.content.decode()
    assert "+525512345678" not in result.content.decode()
    dashboard = client.get(reverse("admin:django_rq_home"))
    assert dashboard.status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_job_sent_before_triggers_were_sealed_still_runs(
    queue: Queue, rq_burst: Callable[..., int]
) -> None:
    queue.enqueue_call("nexus_workflows.fire_and_forget.run_job", args=(LEDGER, {"key": "old"}), job_id="old")
    assert rq_burst() == 1
    assert executions(LEDGER, "old") == 1


@pytest.mark.django_db(transaction=True)
def test_a_failure_whose_message_cannot_be_sealed_still_keeps_the_message_out_of_rq(
    queue: Queue, rq_burst: Callable[..., int], logs: pytest.LogCaptureFixture, settings: Any
) -> None:
    # Anything raised while the failure is handled (here: a worker without PHI keys running
    # a job sent before sealing; as well a Redis error saving the meta, or the job timeout
    # firing) must not carry prepare's error along as its context: RQ logs and stores the
    # whole chain, and django-rq's pages show it to every staff user.
    secret = "Ana López +525512345678"
    queue.enqueue_call(
        "nexus_workflows.fire_and_forget.run_job", args=(FAIL, {"key": "old", "secret": secret}), job_id="old"
    )
    settings.NEXUS_WORKFLOWS = {k: v for k, v in settings.NEXUS_WORKFLOWS.items() if not k.startswith("PHI_")}
    assert rq_burst() == 1
    job = queue.fetch_job("old")
    assert job.get_status() == JobStatus.FAILED
    exc_string = job.latest_result().exc_string
    assert "JobFailed: workflow 'test-ff-fail': prepare raised UpstreamRejected" in exc_string
    assert "+525512345678" not in exc_string  # the frames show source lines, never values
    assert "During handling of the above exception" not in exc_string
    assert SEALED_ERROR not in job.meta
    assert "test-ff-fail job: its error message could not be sealed into the job (PhiConfigurationError)" in (
        logs.text
    )
    assert "+525512345678" not in logs.text


def exits_with_the_patient(trigger: Any) -> None:
    raise SystemExit(f"no reply from {trigger['secret']}")


async def cancelled_with_the_patient(trigger: Any) -> None:
    raise asyncio.CancelledError(f"gave up on {trigger['secret']}")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("prepare", "raised"),
    [(exits_with_the_patient, "SystemExit"), (cancelled_with_the_patient, "CancelledError")],
)
def test_a_prepare_raising_outside_exception_keeps_its_message_out_of_rq_too(
    queue: Queue,
    rq_burst: Callable[..., int],
    logs: pytest.LogCaptureFixture,
    register_workflow: Callable[..., Any],
    prepare: Callable[..., Any],
    raised: str,
) -> None:
    # RQ fails a job on anything it raises, BaseException included, and logs and stores
    # its message: SystemExit (sys.exit() in a library) or an async prepare's
    # CancelledError used to reach the worker's log and the job's results in clear.
    secret = "Ana López +525512345678"
    kind = register_workflow(prepare).kind
    job_id = enqueue(kind, {"key": "x", "secret": secret})
    assert rq_burst() == 1
    job = queue.fetch_job(job_id)
    assert job.get_status() == JobStatus.FAILED
    exc_string = job.latest_result().exc_string
    assert f"JobFailed: workflow '{kind}': prepare raised {raised}" in exc_string
    assert "+525512345678" not in exc_string
    assert "exception raised while executing" in logs.text
    assert "+525512345678" not in logs.text
    assert secret in open_error(job_id, job.meta[SEALED_ERROR])  # the message, sealed


@pytest.mark.django_db(transaction=True)
def test_a_sealed_trigger_moved_onto_another_job_does_not_open(
    queue: Queue, rq_burst: Callable[..., int]
) -> None:
    job_id = enqueue(LEDGER, {"key": "moved"}, delay=3600)  # scheduled: it stays put
    sealed = queue.fetch_job(job_id).args[1]
    queue.enqueue_call("nexus_workflows.fire_and_forget.run_sealed_job", args=(LEDGER, sealed), job_id="copy")
    assert rq_burst() == 1
    failed = queue.fetch_job("copy")
    assert failed.get_status() == JobStatus.FAILED
    assert "SealedDataUnreadable" in failed.latest_result().exc_string
    assert "its sealed trigger cannot be opened" in failed.latest_result().exc_string
    assert executions() == 0


@pytest.mark.django_db(transaction=True)
def test_a_trigger_no_key_opens_fails_without_naming_the_job(
    queue: Queue, rq_burst: Callable[..., int]
) -> None:
    """The job id holds the dedupe key (here a phone number, as a careless project might
    use): RQ records the failure's message and its worker logs it. On the old code the
    message began "fire-and-forget job 'copy-5215587314926': its sealed trigger..."."""
    job_id = enqueue(LEDGER, {"key": "unreadable"}, delay=3600)  # scheduled: it stays put
    sealed = queue.fetch_job(job_id).args[1]
    copy = "copy-5215587314926"
    queue.enqueue_call("nexus_workflows.fire_and_forget.run_sealed_job", args=(LEDGER, sealed), job_id=copy)
    assert rq_burst() == 1
    exc_string = queue.fetch_job(copy).latest_result().exc_string
    assert "its sealed trigger cannot be opened" in exc_string
    assert "5215587314926" not in exc_string
    with pytest.raises(SealedDataUnreadable) as raised:
        open_trigger(copy, sealed)
    assert raised.value.job_id == copy  # for a caller that shows job ids anyway
    assert "5215587314926" not in str(raised.value)


received_lengths: list[int] = []


def large_prepare(trigger: Any) -> None:
    received_lengths.append(len(trigger["document"]))


@pytest.mark.django_db(transaction=True)
def test_a_trigger_of_ten_million_characters_still_opens_in_the_worker(
    queue: Queue, rq_burst: Callable[..., int], register_workflow: Callable[..., Any]
) -> None:
    # The sealed plaintext carries the trigger's length in digits: 10,000,000 has eight.
    # enqueue sets no bound on a trigger, so the worker must open whatever it sealed.
    workflow = register_workflow(large_prepare)
    received_lengths.clear()
    job_id = enqueue(workflow.kind, {"key": "big", "document": "x" * 10_000_000})
    assert rq_burst() == 1
    assert queue.fetch_job(job_id).get_status() == JobStatus.FINISHED
    assert received_lengths == [10_000_000]


def unknown_later(trigger: Any) -> None:
    raise AssertionError("must not run")


@pytest.mark.django_db(transaction=True)
def test_a_kind_unknown_to_the_worker_fails_the_job_with_a_clear_message(
    queue: Queue, rq_burst: Callable[..., int], register_workflow: Callable[..., Any]
) -> None:
    workflow = register_workflow(unknown_later)
    job_id = enqueue(workflow.kind, {"key": "u"})
    registry.unregister(workflow.kind)  # this worker's code does not define it
    assert rq_burst() == 1
    job = queue.fetch_job(job_id)
    assert job.get_status() == JobStatus.FAILED
    assert f"UnknownWorkflow: fire-and-forget job: no workflow is registered for kind '{workflow.kind}'" in (
        job.latest_result().exc_string
    )


def deferred_prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
    raise AssertionError("must not run")


@pytest.mark.django_db(transaction=True)
def test_a_job_for_a_kind_that_is_deferred_in_the_worker_fails_without_running(
    queue: Queue, rq_burst: Callable[..., int], register_workflow: Callable[..., Any]
) -> None:
    workflow = register_workflow(deferred_prepare, retry_schedule=[1])
    job = queue.enqueue(run_job, workflow.kind, {"key": "d"})
    assert rq_burst() == 1
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert "is registered with a retry schedule in this worker" in job.latest_result().exc_string


async def async_prepare(trigger: Any) -> None:
    from asgiref.sync import sync_to_async

    await sync_to_async(Ledger.objects.create)(kind="async", key=trigger["key"], pid=0)


@pytest.mark.django_db(transaction=True)
def test_an_async_prepare_is_awaited(
    queue: Queue, rq_burst: Callable[..., int], register_workflow: Callable[..., Any]
) -> None:
    workflow = register_workflow(async_prepare)
    enqueue(workflow.kind, {"key": "a"})
    assert rq_burst() == 1
    assert executions("async", "a") == 1


# --- options ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_queue_job_timeout_and_at_front_options(queue: Queue, rq_burst: Callable[..., int]) -> None:
    first = enqueue(LEDGER, {"key": "o1"})
    front = enqueue(LEDGER, {"key": "o2"}, at_front=True, job_timeout=timedelta(seconds=30))
    urgent = enqueue(LEDGER, {"key": "o3"}, queue="urgent", job_timeout=7.5)

    assert queue.job_ids == [front, first]
    assert get_queue("urgent").job_ids == [urgent]
    assert queue.fetch_job(first).timeout == 60  # the queue's DEFAULT_TIMEOUT
    assert queue.fetch_job(front).timeout == 30
    assert get_queue("urgent").fetch_job(urgent).timeout == 8
    assert rq_burst("default", "urgent") == 3
    assert executions() == 3


def sleeps(trigger: Any) -> None:
    time.sleep(trigger["seconds"])
    Ledger.objects.create(kind="sleeps", key=trigger["key"], pid=0)


@pytest.mark.django_db(transaction=True)
def test_a_job_running_past_its_job_timeout_is_stopped_and_failed(
    queue: Queue, rq_burst: Callable[..., int], register_workflow: Callable[..., Any]
) -> None:
    workflow = register_workflow(sleeps)
    job_id = enqueue(workflow.kind, {"key": "slow", "seconds": 5}, job_timeout=1)
    assert rq_burst() == 1
    job = queue.fetch_job(job_id)
    assert job.get_status() == JobStatus.FAILED
    assert "prepare raised JobTimeoutException" in job.latest_result().exc_string
    assert executions("sleeps") == 0


@pytest.mark.django_db(transaction=True)
def test_delay_schedules_the_job_and_a_worker_with_the_scheduler_runs_it_when_due(
    queue: Queue, rq_burst: Callable[..., int]
) -> None:
    job_id = enqueue(LEDGER, {"key": "later"}, delay=2)
    scheduled = ScheduledJobRegistry(queue=queue)
    assert job_id in scheduled.get_job_ids()
    assert queue.count == 0
    assert enqueue(LEDGER, {"key": "later"}) is None  # scheduled counts as existing
    assert enqueue(LEDGER, {"key": "later"}, delay=timedelta(seconds=5)) is None
    assert rq_burst(with_scheduler=True) == 0  # not due yet

    due_at = scheduled.get_scheduled_time(job_id)
    wait_until(lambda: time.time() >= due_at.timestamp(), "the job to be due", timeout=5)
    assert rq_burst(with_scheduler=True) == 1
    assert executions("test-ff-ledger", "later") == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": 1}, "unknown option(s) priority. Allowed: at_front, delay, job_timeout, queue"),
        ({"queue": "nope"}, "queue must be the name of a queue in RQ_QUEUES (default, urgent); got a str "),
        ({"queue": "María López"}, "RQ_QUEUES (default, urgent); got a str that is none of them"),
        ({"queue": None}, "queue must be the name of a queue in RQ_QUEUES (default, urgent); got a NoneType"),
        ({"job_timeout": 0}, "job_timeout must be greater than 0 seconds"),
        ({"job_timeout": "1h"}, "job_timeout must be a finite number of seconds or a timedelta; got str"),
        ({"job_timeout": float("nan")}, "job_timeout must be a finite number of seconds or a timedelta"),
        ({"job_timeout": float("inf")}, "job_timeout must be a finite number of seconds or a timedelta"),
        ({"job_timeout": True}, "job_timeout must be a finite number of seconds or a timedelta; got bool"),
        ({"job_timeout": 3654 * 86_400}, "job_timeout must be greater than 0 seconds and at most 3653 days"),
        ({"delay": float("nan")}, "delay must be a finite number of seconds or a timedelta; got float"),
        ({"delay": timedelta(days=3654)}, "delay is too long; allowed: 0 to 3653 days"),
        ({"at_front": 1}, "at_front must be True or False; got int"),
        ({"delay": -1}, "delay must not be negative"),
        ({"delay": "soon"}, "delay must be a finite number of seconds or a timedelta; got str"),
    ],
)
def test_bad_options_are_rejected_before_anything_is_sent(
    rq_redis: redis.Redis, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidEnqueueOption, match=re.escape(message)) as raised:
        enqueue(LEDGER, {"key": "bad"}, **options)
    assert rq_redis.dbsize() == 0
    # The rule, never the value given.
    assert all(repr(value) not in str(raised.value) for value in options.values() if isinstance(value, str))


# --- Redis unreachable -------------------------------------------------------------------------

DOWN = {"default": {"URL": "redis://:s3cret-pw@127.0.0.1:1/0"}}


@pytest.mark.django_db(transaction=True)
def test_unreachable_redis_raises_queue_unavailable_naming_host_and_port(settings: Any) -> None:
    settings.RQ_QUEUES = DOWN
    with pytest.raises(QueueUnavailable) as raised:
        enqueue(LEDGER, {"key": "down"})
    message = str(raised.value)
    assert "cannot reach Redis at 127.0.0.1:1 for queue 'default'" in message
    # The client cannot tell a request that never left from one whose reply was lost.
    assert "nothing was enqueued" not in message
    assert "the job may exist; enqueueing the same trigger again is safe" in message
    assert "s3cret-pw" not in message
    assert DeferredWork.objects.count() == 0


class HttpNotRedis(LoopbackListener):
    """A port that answers as a web server does."""

    def handle(self, connection: socket.socket, index: int) -> None:
        connection.recv(4096)
        connection.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


@pytest.mark.django_db(transaction=True)
def test_a_redis_url_that_reaches_no_redis_server_raises_queue_unavailable(settings: Any) -> None:
    """redis-py's InvalidResponse (whose text quotes the answer) went up as it was."""
    server = HttpNotRedis()
    try:
        settings.RQ_QUEUES = {"default": {"URL": f"redis://:s3cret-pw@127.0.0.1:{server.port}/0"}}
        with pytest.raises(QueueUnavailable) as raised:
            enqueue(LEDGER, {"key": "Zorbatilde"})
    finally:
        server.stop()
    message = str(raised.value)
    assert f"Redis at 127.0.0.1:{server.port} for queue 'default' did not answer as a Redis server" in message
    assert "(InvalidResponse)" in message
    assert "HTTP/1.1" not in message
    assert "s3cret-pw" not in message
    assert "Zorbatilde" not in message
    assert raised.value.__cause__ is None
    assert server.connections >= 1


@pytest.mark.django_db(transaction=True)
def test_unreachable_redis_inside_a_transaction_raises_at_enqueue_and_leaves_nothing_for_commit(
    settings: Any, logs: pytest.LogCaptureFixture
) -> None:
    settings.RQ_QUEUES = DOWN
    with transaction.atomic():
        with pytest.raises(QueueUnavailable, match=r"127\.0\.0\.1:1"):
            enqueue(LEDGER, {"key": "down"})
        assert transaction.get_connection().run_on_commit == []
    assert "lost at commit" not in logs.text
    assert "s3cret-pw" not in logs.text


# --- sending commands again after a connection error ------------------------------------------


def test_a_url_queue_sends_a_command_again_once_by_default(settings: Any) -> None:
    # Nothing listens on port 1; no command is sent here, the clients connect lazily.
    settings.RQ_QUEUES = {
        "default": {"URL": "redis://127.0.0.1:1/0"},
        "other": {"URL": "redis://127.0.0.1:1/1"},
    }
    by_url, by_other = (get_queue(name).connection.get_retry() for name in ("default", "other"))
    assert by_url is not None, "a URL queue's client does not send a command again"
    assert by_url.get_retries() == URL_QUEUE_RETRIES == 1
    assert by_url is not by_other  # its own: a Retry keeps backoff state


def test_a_queue_given_its_own_retry_keeps_it(settings: Any) -> None:
    settings.RQ_QUEUES = {
        "default": {
            "HOST": "127.0.0.1",
            "PORT": 1,
            "DB": 0,
            "REDIS_CLIENT_KWARGS": {"retry": Retry(NoBackoff(), 0)},
        }
    }
    retry = get_queue("default").connection.get_retry()
    assert retry is not None
    assert retry.get_retries() == 0


class HangingUpRedis(LoopbackListener):
    """A listener that takes each connection, reads what the client sends first and hangs
    up: every command (or connection handshake) fails with a connection error, and each
    try of the client's costs one connection, counted."""

    def handle(self, connection: socket.socket, index: int) -> None:
        connection.settimeout(5)
        with contextlib.suppress(OSError):
            connection.recv(65536)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("given", "connections"),
    [({"retry": Retry(NoBackoff(), 2)}, 3), ({"retry": None}, 1), ({}, 1 + URL_QUEUE_RETRIES)],
    ids=["own-retry", "no-retry", "default"],
)
def test_a_url_queue_tries_a_redis_that_is_down_as_often_as_its_retry_says(
    settings: Any, given: dict[str, Any], connections: int
) -> None:
    # django-rq hands REDIS_CLIENT_KWARGS to HOST/PORT clients only; the app applies a URL
    # queue's own retry (None: none), and without one gives it one try more, not redis-py's
    # default (11 tries, each reconnecting with tries of its own: about 10 minutes on a
    # server gone from the network).
    server = HangingUpRedis()
    try:
        settings.RQ_QUEUES = {
            "default": {"URL": f"redis://127.0.0.1:{server.port}/0", "REDIS_CLIENT_KWARGS": given}
        }
        with pytest.raises(QueueUnavailable):
            enqueue(LEDGER, {"key": "hung-up"})
    finally:
        server.stop()
    assert server.connections == connections

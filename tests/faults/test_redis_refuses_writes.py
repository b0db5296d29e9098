"""Fault suite: a private ``redis-server`` that answers but refuses writes — out of memory
under ``noeviction``, or a read-only replica after a failover. ``enqueue`` raises
``QueueUnavailable`` (as when Redis is down), naming no job id or trigger, writes nothing,
and works again once the server takes writes."""

from __future__ import annotations

import pytest
import redis

from nexus_workflows import QueueUnavailable, enqueue

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgresql,  # once per CI run: the fault suite runs on the PostgreSQL leg
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]


def refuse_writes(client: redis.Redis, how: str) -> None:
    if how == "out of memory":
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
    else:  # a replica of a master that is not there: it stays read-only
        client.execute_command("REPLICAOF", "127.0.0.1", "1")


def accept_writes(client: redis.Redis, how: str) -> None:
    if how == "out of memory":
        client.config_set("maxmemory", "0")
    else:
        client.execute_command("REPLICAOF", "NO", "ONE")


@pytest.mark.parametrize("how", ["out of memory", "read-only replica"])
def test_a_redis_refusing_writes_raises_queue_unavailable_and_writes_nothing(
    private_redis_client: redis.Redis, how: str
) -> None:
    refuse_writes(private_redis_client, how)
    with pytest.raises(QueueUnavailable) as raised:
        enqueue("test-ff-ledger", {"key": "visit-77", "name": "Ana López"})
    message = str(raised.value)
    port = private_redis_client.connection_pool.connection_kwargs["port"]
    assert f"Redis at 127.0.0.1:{port} refused" in message
    assert "enqueueing the same trigger again once Redis accepts writes is safe" in message
    # redis-py quotes the refused command with its arguments; none of it is repeated.
    assert all(part not in message for part in ("visit-77", "Ana", "rq:"))
    assert private_redis_client.keys("rq:job:*") == []

    accept_writes(private_redis_client, how)
    assert enqueue("test-ff-ledger", {"key": "visit-77"}) == "test-ff-ledger__visit-77"

"""The tests' private servers (the fault suite's PostgreSQL and Redis, PgBouncer) whose
free port another process took before they listened: the server's own log says the
address is in use, and it starts on another port; the other process's listener is left
alone. Once started, a server keeps its port: one taken while the server was down (a
restart) fails the test, saying so, rather than moving where no client looks.

The port is taken by listening on it first: the module's ``free_port`` hands that port to
the server as its first pick (``bin/test`` runs two streams of tests at once, so another
process can really do so between the pick and the server's start)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from types import ModuleType

import psycopg
import pytest
import redis

from tests import pgbouncer, ports
from tests.conftest import IN_CI
from tests.faults import servers
from tests.faults.servers import PrivatePostgres, PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]  # once per run, with the fault suite


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[ModuleType], socket.socket]]:
    """``taken(module)``: a listening socket (another program's server) whose port the
    module's next ``free_port()`` picks; later picks are free ports as usual."""
    listeners: list[socket.socket] = []

    def take(module: ModuleType) -> socket.socket:
        other = socket.socket()
        other.bind(("127.0.0.1", 0))
        other.listen()
        other.setblocking(False)
        listeners.append(other)
        picks = iter([other.getsockname()[1]])
        monkeypatch.setattr(module, "free_port", lambda: next(picks, None) or ports.free_port())
        return other

    yield take
    for listener in listeners:
        listener.close()


def left_alone(other: socket.socket) -> bool:
    """Whether the other program's listener still listens and nothing connected to it
    (no test talked to a server not its own)."""
    try:
        other.accept()[0].close()
    except BlockingIOError:
        return True
    return False


def occupy(port: int) -> socket.socket:
    """Another program's server listening on ``port`` (SO_REUSEADDR, as servers set it: the
    port's connections in TIME_WAIT do not keep it out)."""
    other = socket.socket()
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("127.0.0.1", port))
    other.listen()
    return other


def test_a_postgresql_whose_port_was_taken_starts_on_another_and_keeps_it(
    taken: Callable[[ModuleType], socket.socket],
) -> None:
    """On the old code ``pg_ctl start`` failed (CalledProcessError): no second port."""
    other = taken(servers)
    server = PrivatePostgres()
    try:
        server.start()
        assert server.port != other.getsockname()[1]
        assert "Address already in use" in server.log.read_text()  # the server said so
        with psycopg.connect(server.url(), autocommit=True) as connection:
            assert connection.execute("SHOW port").fetchone() == (str(server.port),)
        port = server.port
        server.restart("immediate")
        assert server.port == port  # its clients' port
        with psycopg.connect(server.url(), autocommit=True) as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)
        server.stop()
        with occupy(port), pytest.raises(AssertionError) as raised:
            server.start()
        assert f"could not listen on its port {port} again: another process took it" in str(raised.value)
    finally:
        server.cleanup()
    assert left_alone(other)


def test_a_redis_whose_port_was_taken_starts_on_another_and_keeps_it(
    taken: Callable[[ModuleType], socket.socket],
) -> None:
    """On the old code the start PINGed the other program's port for 20 s, then failed:
    "redis-server did not answer on port …"."""
    other = taken(servers)
    server = PrivateRedis()
    try:
        server.start()
        assert server.port != other.getsockname()[1]
        assert "Address already in use" in server.log.read_text()
        client = redis.Redis(host="127.0.0.1", port=server.port)
        assert client.ping()
        port = server.port
        server.kill()
        server.start()  # after a kill -9: the same port
        assert server.port == port
        assert client.ping()
        client.close()
        server.kill()
        with occupy(port), pytest.raises(AssertionError) as raised:
            server.start()
        assert f"could not listen on its port {port} again: another process took it" in str(raised.value)
    finally:
        server.cleanup()
    assert left_alone(other)


def test_a_pgbouncer_whose_port_was_taken_starts_on_another(
    taken: Callable[[ModuleType], socket.socket],
) -> None:
    """On the old code the other program's listener accepted the readiness check's
    connection: the PgBouncer was taken as started there, on a port it did not have."""
    if not pgbouncer.PgBouncer.available():
        message = "Debian's pgbouncer is not installed (bin/test installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    from django.conf import settings

    direct = settings.DATABASES["direct"]
    other = taken(pgbouncer)
    upstream = (direct["HOST"] or "127.0.0.1", int(direct["PORT"] or 5432))
    with pgbouncer.PgBouncer(*upstream, user=direct["USER"] or "postgres") as bouncer:
        assert bouncer.port != other.getsockname()[1]
        assert "Address already in use" in bouncer.log()
        with psycopg.connect(bouncer.url("postgres"), autocommit=True, connect_timeout=10) as connection:
            assert connection.execute("SELECT 1").fetchone() == (1,)
    assert left_alone(other)

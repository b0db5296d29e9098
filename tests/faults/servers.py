"""Private servers for the fault suite: a PostgreSQL cluster and a Redis server of the
test's own, on free loopback ports, that the test may restart or kill without touching
the machine's shared services.

A server's first start moves to another free port while the one it picked is taken (its
own log says the address is in use: another process took the port since it was picked);
once started, its port stays, for its clients use it: a start or restart that finds it
taken then fails the test, saying so (rare: :func:`tests.ports.free_port` picks ports
below the ephemeral range, where the machine's other sockets do not land)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import IN_CI
from tests.ports import PortTaken, free_port, read_since, size_of, start_keeping_port

if TYPE_CHECKING:
    from tests.faults.partitions import Partitions


def missing(what: str) -> None:
    """A missing tool fails in CI (bin/test installs it) and skips elsewhere."""
    message = f"{what} is not available; bin/test installs it"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def _postgres_bin() -> Path:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    missing("PostgreSQL's initdb")
    raise AssertionError("unreachable")


def under_faketime(offset: str) -> dict[str, Any]:
    """ManagePy options that run the process with its wall clock moved by ``offset``:
    Debian's libfaketime preloaded into the Python process itself (the ``faketime``
    wrapper forks, so a test could not signal the runner by its pid), monotonic clocks
    left alone so timeouts still work. (libfaketime 0.9.10 makes ``time.sleep`` fail with
    EINVAL then; waits on events and conditions are fine, and the runner uses only those.)"""
    library = Path(
        f"/usr/lib/{sysconfig.get_config_var('MULTIARCH') or 'x86_64-linux-gnu'}/faketime/libfaketime.so.1"
    )
    if not library.exists():
        pytest.fail(f"{library} is missing: bin/test installs Debian's faketime")
    return {"env": {"LD_PRELOAD": str(library), "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}}


class PrivatePostgres:
    """``initdb`` as the ``postgres`` user into a temporary directory, its own port; or,
    ``standby_of`` a running one, a hot standby of it: a base backup that streams its WAL
    (``pg_basebackup -R``; initdb's pg_hba trusts replication from 127.0.0.1).

    ``inside`` a network namespace (:class:`tests.faults.partitions.Partitions`), it runs
    there, listening on all of the namespace's addresses, and trusts the host's paths to
    it; :meth:`url` then names the namespace's virtual IP unless told another host."""

    def __init__(
        self, *, standby_of: PrivatePostgres | None = None, inside: Partitions | None = None
    ) -> None:
        self.bin = _postgres_bin()
        self.inside = inside
        self.host = inside.virtual_ip if inside else "127.0.0.1"
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="nw-faults-pg-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        if os.geteuid() == 0:  # initdb refuses to run as root: the cluster is postgres's
            shutil.chown(self.directory, "postgres", "postgres")
        if standby_of is None:
            self._as_postgres(
                str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync"
            )
        else:
            self._as_postgres(
                str(self.bin / "pg_basebackup"),
                "-D", str(self.data),
                "-h", "127.0.0.1",
                "-p", str(standby_of.port),
                "-U", "postgres",
                "-R",  # standby.signal and primary_conninfo: it starts as a streaming standby
                "-X", "stream",
                "-c", "fast",
                "--no-sync",
            )  # fmt: skip
        self._listen = "127.0.0.1"
        if inside is not None:
            self._listen = "*"  # the namespace's own addresses only: nothing else can reach them
            with (self.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {inside.subnet} trust\n")
        self._options = self._options_for(self.port)
        self._started = False

    def _options_for(self, port: int) -> str:
        # lc_messages=C: the log's words, which say when the port was taken, are English.
        return (
            f"-c port={port} -c listen_addresses={self._listen} -c unix_socket_directories={self.directory} "
            "-c fsync=off -c max_connections=100 -c lc_messages=C"
        )

    def _as_postgres(self, *command: str, timeout: float = 120, inside: bool = False) -> None:
        if os.geteuid() == 0:
            command = ("runuser", "-u", "postgres", "--", *command)
        if inside and self.inside is not None:
            command = tuple(self.inside.inner_command(*command))
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    def start(self) -> None:
        """``pg_ctl start``: the first on a free port (see the module's text), any later one
        on the port it had."""
        self.port = start_keeping_port(
            self._start_on, self.port, first=not self._started, what="the private PostgreSQL"
        )
        self._started = True

    def _start_on(self, port: int) -> None:
        if port != self.port:
            self.port, self._options = port, self._options_for(port)
        # pg_ctl forks the server: started inside the namespace, it stays there.
        self._listening_or_taken("start", "-w", "-l", str(self.log), "-o", self._options)

    def restart(self, mode: str) -> float:
        """``pg_ctl restart -m mode`` on the same port; returns how long the server was
        away (seconds)."""
        began = time.monotonic()
        start_keeping_port(
            lambda port: self._listening_or_taken(
                "restart", "-w", "-m", mode, "-l", str(self.log), "-o", self._options
            ),
            self.port,
            first=False,
            what="the private PostgreSQL",
        )
        return time.monotonic() - began

    def _listening_or_taken(self, *pg_ctl: str) -> None:
        """``pg_ctl`` starting the server (in the namespace, if any); :class:`PortTaken` when
        it failed because the server could not listen on its port (its log says so)."""
        logged = size_of(self.log)
        try:
            self._pg_ctl(*pg_ctl, inside=True)
        except subprocess.CalledProcessError:
            said = read_since(self.log, logged)
            if "Address already in use" in said and "could not create any TCP/IP sockets" in said:
                raise PortTaken(f"its log: {said.strip()[-600:]}") from None
            raise

    def stop(self) -> None:
        self._pg_ctl("stop", "-m", "immediate")

    def promote(self) -> None:
        """A standby ends recovery and takes writes (``pg_ctl promote``, waiting until it does)."""
        self._pg_ctl("promote", "-w")

    def _pg_ctl(self, *args: str, inside: bool = False) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), *args, inside=inside)

    def url(self, database: str = "postgres", *, host: str | None = None) -> str:
        return f"postgres://postgres@{host or self.host}:{self.port}/{database}"

    def create_database(self, name: str, *, template: str | None = None) -> None:
        """``CREATE DATABASE``; from ``template``, a copy of it (no session may be on it)."""
        import psycopg

        copy = f' TEMPLATE "{template}"' if template else ""
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"{copy}')

    def cleanup(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.stop()
        self._kill_postmaster()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _kill_postmaster(self) -> None:
        """If ``pg_ctl stop`` failed, ``kill -9`` the server by the PID in its pid file,
        once its command line shows it is this cluster's (a PID may have been reused)."""
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
            if str(self.data).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


class PrivateRedis:
    """``redis-server`` on its own port, appending every write to its log before it
    answers (``appendfsync always``), so a ``kill -9`` loses nothing it acknowledged."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            missing("redis-server")
        self.binary = str(binary)
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="nw-faults-redis-"))
        self.log = self.directory / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._started = False

    def start(self) -> None:
        """The first start on a free port (see the module's text), any later one (after
        :meth:`kill`) on the port it had."""
        self.port = start_keeping_port(
            self._start_on, self.port, first=not self._started, what="the private redis-server"
        )
        self._started = True

    def _start_on(self, port: int) -> None:
        self.port = port
        logged = size_of(self.log)
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
                "--logfile", str(self.log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            said = read_since(self.log, logged)
            if self.process.poll() is not None:
                if "Address already in use" in said:
                    raise PortTaken(f"its log: {said.strip()[-600:]}")
                raise AssertionError(f"redis-server exited ({self.process.returncode}); its log:\n{said}")
            # Its own log says it listens: whatever else answers on the port is not taken for it.
            if "Ready to accept connections" in said and self._answers():
                return
            time.sleep(0.05)
        raise AssertionError(
            f"redis-server did not answer on port {port}; its log:\n{read_since(self.log, logged)}"
        )

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """``kill -9`` by PID."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cleanup(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.directory, ignore_errors=True)

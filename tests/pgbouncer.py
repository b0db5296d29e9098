"""A private PgBouncer (Debian's ``pgbouncer``) in transaction-pooling mode, on a free port,
in front of a PostgreSQL server: for the tests and the benchmarks.

Authentication is ``trust`` towards the clients; PgBouncer logs in to PostgreSQL as the
client's user (the shared server trusts loopback). PgBouncer refuses to run as root, so
when started by root it runs as the ``postgres`` user.

As a program, it serves until SIGTERM (``bin/test`` runs a test leg through it)::

    python -m tests.pgbouncer --upstream postgres://postgres@127.0.0.1:5432/db --url-file F \
        [--fresh-test-database]

``--fresh-test-database`` first drops the test database pytest-django makes of ``db``
(``test_db``) straight on PostgreSQL: the leg runs with ``--reuse-db`` (PgBouncer's server
sessions would block pytest-django's own drop), so rows and test triggers a killed run left
there would otherwise meet the next run. No PgBouncer of this program holds it yet; the
sessions of one a killed run left running are ended (``WITH (FORCE)``).
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from tests.ports import PortTaken, free_port, read_since, size_of, start_on_a_free_port

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class PgBouncer:
    """``start()`` / ``stop()``; ``url(database)`` is a DATABASE_URL through it."""

    def __init__(
        self,
        upstream_host: str = "127.0.0.1",
        upstream_port: int = 5432,
        *,
        user: str = "postgres",
        pool_mode: str = "transaction",
        pool_size: int = 20,
        settings: Mapping[str, object] | None = None,
    ) -> None:
        self.upstream_host = upstream_host
        # More lines of its [pgbouncer] section (name = value).
        self.settings = dict(settings or {})
        self.upstream_port = upstream_port
        self.user = user
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.directory = Path(tempfile.mkdtemp(prefix="nw-pgbouncer-"))

    @classmethod
    def available(cls) -> bool:
        return Path(BINARY).exists()

    def url(self, database: str) -> str:
        return f"postgres://{self.user}@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 20) -> PgBouncer:
        """Start it on a free port; on another while the one picked is taken (its log says
        the address is in use: another process took the port since it was picked)."""
        self.port = start_on_a_free_port(
            lambda port: self._start_on(port, timeout), free_port(), what="pgbouncer"
        )
        return self

    def _start_on(self, port: int, timeout: float) -> None:
        run_as = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self.port = port
        self._write_config()
        if run_as is not None:
            os.chown(self.directory, run_as.pw_uid, run_as.pw_gid)
            for path in self.directory.iterdir():
                os.chown(path, run_as.pw_uid, run_as.pw_gid)
        log, logged = self.directory / "pgbouncer.log", size_of(self.directory / "pgbouncer.log")
        self.process = subprocess.Popen(
            [BINARY, str(self.directory / "pgbouncer.ini")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=run_as.pw_uid if run_as else None,
            group=run_as.pw_gid if run_as else None,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            said = read_since(log, logged)
            if self.process.poll() is not None:
                if "Address already in use" in said:
                    raise PortTaken(f"its log: {said.strip()[-600:]}")
                break
            # Its own log says it listens: whatever else answers on the port is not taken for it.
            if f"listening on 127.0.0.1:{port}" in said and self._accepts():
                return
            time.sleep(0.05)
        self.stop(remove=False)
        raise RuntimeError(f"pgbouncer did not start; its log:\n{read_since(log, logged)[-3000:]}")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def _write_config(self) -> None:
        (self.directory / "userlist.txt").write_text(f'"{self.user}" ""\n')
        (self.directory / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={self.upstream_host} port={self.upstream_port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {self.directory / 'userlist.txt'}",
                    f"pool_mode = {self.pool_mode}",
                    "max_client_conn = 500",
                    f"default_pool_size = {self.pool_size}",
                    "ignore_startup_parameters = extra_float_digits,options",
                    f"logfile = {self.directory / 'pgbouncer.log'}",
                    *(f"{name} = {value}" for name, value in self.settings.items()),
                    "",
                ]
            )
        )

    def stop(self, *, remove: bool = True) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # immediate shutdown
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if remove:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def drop_test_database(upstream: str) -> str:
    """Drop pytest-django's test database of the ``upstream`` URL's database, connecting
    straight to PostgreSQL (its ``postgres`` database); its name, for the log."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(upstream)
    name = "test_" + parts.path.lstrip("/")
    with psycopg.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=parts.username or "postgres",
        password=parts.password,
        dbname="postgres",
        autocommit=True,
    ) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    return name


def serve() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--upstream", required=True, help="postgres://user@host:port/database")
    parser.add_argument(
        "--url-file", required=True, help="gets the database's URL through PgBouncer once it listens"
    )
    parser.add_argument(
        "--fresh-test-database",
        action="store_true",
        help="first drop the upstream database's test database (test_<database>), bypassing PgBouncer",
    )
    options = parser.parse_args()
    if options.fresh_test_database:
        dropped = drop_test_database(options.upstream)
        print(f"tests.pgbouncer: dropped {dropped} (if it was there)", flush=True)
    upstream = urlsplit(options.upstream)
    bouncer = PgBouncer(
        upstream.hostname or "127.0.0.1", upstream.port or 5432, user=upstream.username or "postgres"
    )
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    bouncer.start()
    try:
        Path(options.url_file).write_text(bouncer.url(upstream.path.lstrip("/")) + "\n")
        while not stopping and bouncer.process is not None and bouncer.process.poll() is None:
            time.sleep(0.2)
    finally:
        bouncer.stop()


if __name__ == "__main__":
    serve()

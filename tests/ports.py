"""Ports for the servers the tests start, and ports where nothing may listen.

A port found free and only later listened on by a server can be taken in between:
``bin/test`` runs two streams of tests at once, and other suites may run beside it. So:

* :func:`free_port` picks a port nothing is bound to on 127.0.0.1, *below* the kernel's
  ephemeral range (``ip_local_port_range``), where neither a ``bind`` to port 0 nor an
  outgoing connection's local port ever lands: only a process naming that very port can
  take it. That matters most while a server the test stopped is down (``pg_ctl restart``,
  a Redis killed and started again): it keeps its port, which the rest of the machine's
  ephemeral sockets cannot take meanwhile.
* :func:`start_on_a_free_port` starts a server, and again on another free port while the
  server itself says its address is in use (:class:`PortTaken`).
* :func:`refusing_port` holds a port bound but not listening: connections to it are
  refused, and no other process can listen on it, for as long as the test needs.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

# Ports below this are left alone: well-known and development servers (8000, 5432, 6379…)
# may start there later.
LOWEST = 20000
# Fewer candidates than this below the ephemeral range (a machine whose range starts low):
# the kernel's pick (port 0) instead.
ENOUGH = 2000
# Tries of start_on_a_free_port before it gives up.
ATTEMPTS = 5


class PortTaken(Exception):
    """The server could not listen on its port: its own log or exit says the address is in use."""


def _below_ephemeral() -> range:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(LOWEST, low)


def _bindable(port: int) -> bool:
    """Whether nothing is bound to 127.0.0.1:``port`` (not even a connection in TIME_WAIT:
    no SO_REUSEADDR)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing is bound to on 127.0.0.1 now, outside the ephemeral range when it can
    (see the module's text); a server started on it later may still find it taken."""
    candidates = _below_ephemeral()
    if len(candidates) >= ENOUGH:
        for _ in range(100):
            port = random.choice(candidates)
            if _bindable(port):
                return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def size_of(path: Path) -> int:
    """How long a server's log is now (0 before it exists): where :func:`read_since` starts."""
    return path.stat().st_size if path.exists() else 0


def read_since(path: Path, offset: int) -> str:
    """What ``path`` (a server's log) gained after its first ``offset`` bytes."""
    if not path.exists():
        return ""
    with path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def start_on_a_free_port(start: Callable[[int], None], port: int, *, what: str) -> int:
    """``start(port)``; while it raises :class:`PortTaken`, again on another free port, up
    to :data:`ATTEMPTS` times in all. Returns the port the server listens on."""
    taken: list[int] = []
    for _ in range(ATTEMPTS):
        try:
            start(port)
        except PortTaken:
            taken.append(port)
            port = free_port()
            continue
        return port
    raise AssertionError(f"{what} found its port taken {len(taken)} times in a row (ports {taken})")


def start_keeping_port(start: Callable[[int], None], port: int, *, first: bool, what: str) -> int:
    """A server's ``start(port)``: its ``first`` on a free port (:func:`start_on_a_free_port`);
    any later one (a restart, a start after a kill) on ``port``, which its clients use, so
    it cannot move: taken meanwhile, the test cannot go on. Returns the port."""
    if first:
        return start_on_a_free_port(start, port, what=what)
    try:
        start(port)
    except PortTaken as taken:
        raise AssertionError(
            f"{what} could not listen on its port {port} again: another process took it while "
            f"the server was down ({taken})"
        ) from None
    return port


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A port bound on 127.0.0.1 and not listening for the ``with`` block: the kernel refuses
    connections to it, and no other process can bind it (nor listen on it) meanwhile."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])

"""The runner's ``/metrics`` endpoint: prometheus-client's WSGI app on a threading HTTP
server of our own, as ``prometheus_client.start_http_server`` starts one, with three
differences:

* a failure to listen is :class:`MetricsEndpointUnavailable`, which says what is to blame
  (:class:`Blame`: a host that does not resolve, an address not this host's, or the
  port), so ``runworkflows`` blames the port for a taken port and for nothing else;
* each connection has a socket timeout (``METRICS_IDLE_TIMEOUT``): the server gives every
  connection a thread, and a client that connects and sends nothing (a port scanner, a
  half-open connection, a load balancer's probe) held its thread for good, and so did one
  sending a byte now and then. Such a client is dropped quietly once the timeout has passed
  without its whole request; a scrape's request arrives at once, and the time the answer
  takes to compute (the database's figures) does not count;
* at most ``METRICS_MAX_CONNECTIONS`` connections are served at once: a client opening
  many got a thread each. At the cap, the oldest connection whose request is not in yet
  gives way to the new one (a scrape sends its request at once: a client holding the
  slots with connections that send nothing, each renewed within the idle timeout, kept
  every scrape out). When every slot is answering a request, a new connection is closed
  at once, without a thread (a scrape retries at its next interval; waiting for a slot
  would hold the accept loop, and ``shutdown``, behind it).
"""

from __future__ import annotations

import contextlib
import errno
import io
import socket
import threading
import time
from enum import StrEnum
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

THREAD_NAME = "nexus-workflows-metrics"
#: Seconds the accept loop waits for the slot of a connection it shut to give way (its
#: thread, woken by the shutdown, gives it back within a moment).
GIVE_WAY_WAIT = 1.0


class Blame(StrEnum):
    """What a failure to listen is down to."""

    #: The host name has no address (the lookup failed).
    LOOKUP = "lookup"
    #: The host's address is not one of this machine's.
    ADDRESS = "address"
    #: The port: taken, or not allowed to this process.
    PORT = "port"


class MetricsEndpointUnavailable(OSError):
    """The metrics endpoint could not listen on its host and port. An ``OSError``, as the
    bind's own error was before; its message names the address and the system's reason,
    and :attr:`blame` what is to blame."""

    def __init__(self, host: str, port: int, reason: str, blame: Blame = Blame.PORT) -> None:
        super().__init__(f"cannot serve metrics on {host}:{port} ({reason})")
        self.host = host
        self.port = port
        self.reason = reason
        self.blame = blame


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape's thread never holds the runner's exit
    max_connections = 1  # set per endpoint by serve()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(self.max_connections)
        # The connections served whose request is not in yet, oldest first.
        self._unread: dict[Any, None] = {}
        self._unread_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, up to the cap; beyond it the connection is closed."""
        if not self._take_slot():
            self.shutdown_request(request)
            return
        with self._unread_lock:
            self._unread[request] = None
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(request)  # no thread started: nothing else gives the slot back
            raise

    def _take_slot(self) -> bool:
        """A slot for a new connection: a free one, or the slot of the oldest connection
        still without its request, which is shut (its thread's read ends at once)."""
        if self._slots.acquire(blocking=False):
            return True
        with self._unread_lock:
            oldest = next(iter(self._unread), None)
            self._unread.pop(oldest, None)
        if oldest is None:  # every slot answers a request
            return False
        with contextlib.suppress(OSError):  # closed meanwhile: its slot is coming back
            oldest.shutdown(socket.SHUT_RDWR)
        return self._slots.acquire(timeout=GIVE_WAY_WAIT)

    def request_in(self, request: Any) -> None:
        """A connection's request is in: it no longer gives way to a new connection."""
        with self._unread_lock:
            self._unread.pop(request, None)

    def _give_back(self, request: Any) -> None:
        self.request_in(request)
        self._slots.release()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(request)


class _RequestReads(io.RawIOBase):
    """A connection's reads, which until its request is in (:attr:`deadline`) wait only
    what is left of the idle timeout: a socket timeout alone bounds each read, and a client
    sending a byte now and then held its thread for good."""

    def __init__(self, connection: socket.socket, seconds: float | None) -> None:
        self.connection = connection
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no whole request within METRICS_IDLE_TIMEOUT")
            self.connection.settimeout(left)
        return self.connection.recv_into(buffer)


class _Handler(WSGIRequestHandler):
    """One connection: one request (HTTP/1.0), under a socket timeout (its class's
    ``timeout``, which ``StreamRequestHandler.setup`` applies) and, until the request is
    in, a deadline as long (:class:`_RequestReads`)."""

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own file: the reads go through the deadline instead
        self.request_reads = _RequestReads(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self.request_reads)

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        # The request is in: the answer's writes wait the whole timeout again, each, and
        # this connection no longer gives way to a new one.
        self.request_reads.deadline = None
        server: Any = self.server
        server.request_in(self.request)
        self.connection.settimeout(self.timeout)
        return parsed

    def handle(self) -> None:
        try:
            super().handle()
        except (TimeoutError, ConnectionError):
            # Sent nothing (or stopped reading) within the timeout, or went away: the
            # server closes the socket; socketserver would print a traceback instead.
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing per request (prometheus-client's handler is silent too)."""


def serve(
    host: str, port: int, registry: CollectorRegistry, *, idle_timeout: float, max_connections: int
) -> WSGIServer:
    """Serve ``registry`` at ``http://host:port/metrics`` on a daemon thread, at most
    ``max_connections`` at once; the server (its ``server_address`` names the port 0
    picked). Raises :class:`MetricsEndpointUnavailable` when it cannot listen there."""
    try:
        family, address = _family_and_address(host, port)
    except OSError as error:  # socket.gaierror: the name has no address
        raise MetricsEndpointUnavailable(host, port, _reason(error), Blame.LOOKUP) from error
    attributes = {"address_family": family, "max_connections": max_connections}
    server_class = type("MetricsServer", (_Server,), attributes)
    handler_class = type("MetricsHandler", (_Handler,), {"timeout": idle_timeout})
    try:
        server: WSGIServer = make_server(address, port, make_wsgi_app(registry), server_class, handler_class)
    except OSError as error:  # the bind
        blame = Blame.ADDRESS if error.errno == errno.EADDRNOTAVAIL else Blame.PORT
        raise MetricsEndpointUnavailable(host, port, _reason(error), blame) from error
    threading.Thread(target=server.serve_forever, name=THREAD_NAME, daemon=True).start()
    return server


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def _family_and_address(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """IPv4 or IPv6 as ``host`` is (``::1`` too), as prometheus-client chooses."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])

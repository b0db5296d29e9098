"""The runner's ``/metrics`` endpoint: prometheus-client's WSGI app on a threading HTTP
server of our own, as ``prometheus_client.start_http_server`` starts one, with two
differences:

* a failure to listen (the port taken, an address not this host's) is
  :class:`MetricsEndpointUnavailable`, so ``runworkflows`` blames the port for that and
  for nothing else;
* each connection has a socket timeout (``METRICS_IDLE_TIMEOUT``): the server gives every
  connection a thread, and a client that connects and sends nothing (a port scanner, a
  half-open connection, a load balancer's probe) held its thread for good, and so did one
  sending a byte now and then. Such a client is dropped quietly once the timeout has passed
  without its whole request; a scrape's request arrives at once, and the time the answer
  takes to compute (the database's figures) does not count.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

THREAD_NAME = "nexus-workflows-metrics"


class MetricsEndpointUnavailable(OSError):
    """The metrics endpoint could not listen on its host and port. An ``OSError``, as the
    bind's own error was before; its message names the address and the system's reason."""

    def __init__(self, host: str, port: int, reason: str) -> None:
        super().__init__(f"cannot serve metrics on {host}:{port} ({reason})")
        self.host = host
        self.port = port
        self.reason = reason


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape's thread never holds the runner's exit


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
        # The request is in: the answer's writes wait the whole timeout again, each.
        self.request_reads.deadline = None
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


def serve(host: str, port: int, registry: CollectorRegistry, *, idle_timeout: float) -> WSGIServer:
    """Serve ``registry`` at ``http://host:port/metrics`` on a daemon thread; the server
    (its ``server_address`` names the port 0 picked). Raises
    :class:`MetricsEndpointUnavailable` when it cannot listen there."""
    try:
        family, address = _family_and_address(host, port)
        server_class = type("MetricsServer", (_Server,), {"address_family": family})
        handler_class = type("MetricsHandler", (_Handler,), {"timeout": idle_timeout})
        server: WSGIServer = make_server(address, port, make_wsgi_app(registry), server_class, handler_class)
    except OSError as error:  # the bind, or a host that does not resolve
        raise MetricsEndpointUnavailable(host, port, error.strerror or type(error).__name__) from error
    threading.Thread(target=server.serve_forever, name=THREAD_NAME, daemon=True).start()
    return server


def _family_and_address(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """IPv4 or IPv6 as ``host`` is (``::1`` too), as prometheus-client chooses."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, sockaddr = infos[0]
    return family, str(sockaddr[0])

"""A deadline on a whole HTTP request: connecting, sending, and the answer's headers and body.

requests' timeouts bound each wait on the socket, not the request, and so does urllib3's
``Timeout(total=...)`` (it only shortens the read timeout by what the connect took; its
own documentation says so): a server that sends a byte a second keeps a request going
as long as it likes. Checking a deadline between chunks of a streamed body would not do
either: reading one chunk waits for the whole chunk, and the status line and headers
are read before any chunk.

:class:`DeadlineAdapter` holds a request to the ``total`` of the urllib3
:class:`~urllib3.util.Timeout` given as its ``timeout``. A timer armed for the request
shuts its socket down when ``total`` has passed (``socket.shutdown`` wakes a read or
write blocked in another thread: the mechanism of urllib3's own
``HTTPResponse.shutdown()``), and the request fails with
:class:`RequestDeadlineExceeded`, a requests ``ReadTimeout``, or with
:class:`ConnectDeadlineExceeded`, a ``ConnectTimeout``, when it was still connecting
(a proxy's tunnel, a TLS handshake after a slow connect): nothing was sent. ``connect``
and ``read`` still bound each wait, as urllib3 applies them (a TLS handshake as a whole
is bounded by ``connect``: Python's ssl module keeps one deadline for it).

Not covered: resolving the host name (``getaddrinfo`` cannot be interrupted; the
resolver's own timeouts apply), and the body of a ``stream=True`` response, which is
read after ``send`` returns (pyairtable never streams).
"""

from __future__ import annotations

import contextvars
import os
import socket
import threading
from typing import Any, TypeVar, cast

import requests
from requests.adapters import HTTPAdapter
from urllib3 import HTTPConnectionPool
from urllib3.util import Timeout


class RequestDeadlineExceeded(requests.exceptions.ReadTimeout):
    """The request was sent (or may have been) and its answer was not complete by the
    deadline. The message never names the URL."""


class ConnectDeadlineExceeded(requests.exceptions.ConnectTimeout):
    """The connection was not ready by the deadline; nothing of the request was sent."""


# The request the current thread is sending through a DeadlineAdapter, if any: the
# connection classes register their sockets with it.
_current: contextvars.ContextVar[_Watch | None] = contextvars.ContextVar("airtable_deadline", default=None)


class _Watch:
    """The sockets of one request, shut down once its deadline has passed.

    It keeps duplicates of the sockets (``os.dup``), closed when the request ends: the
    timer never touches a descriptor the connection may have closed (and the system
    given to another file) meanwhile, and a duplicate of the TCP socket still reaches a
    connection whose socket is being wrapped in TLS.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._ended = False
        self._expired = False
        self._connecting = False
        self.interrupted = False
        self.while_connecting = False

    def add(self, sock: Any) -> None:
        duplicate = _duplicate(sock)
        if duplicate is None:
            return
        with self._lock:
            if self._ended:
                duplicate.close()
                return
            self._sockets.append(duplicate)
            if self._expired:  # it expired while this socket was being made
                self._shut(duplicate)

    def connecting(self, value: bool) -> None:
        with self._lock:
            self._connecting = value

    def expire(self) -> None:
        """The timer's: shut every socket of the request down."""
        with self._lock:
            if self._ended:
                return
            self._expired = True
            for sock in self._sockets:
                self._shut(sock)

    def end(self) -> None:
        with self._lock:
            self._ended = True
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()

    def _shut(self, sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return  # the connection is already gone
        if not self.interrupted:
            self.interrupted = True
            self.while_connecting = self._connecting


def _duplicate(sock: Any) -> socket.socket | None:
    try:
        fd = os.dup(sock.fileno())
    except (OSError, AttributeError, ValueError):
        return None  # closed, or not backed by a descriptor
    try:
        return socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None


def _watch(sock: Any) -> None:
    watch = _current.get()
    if watch is not None and sock is not None:
        watch.add(sock)


class _WatchedConnection:
    """Mixed into urllib3's connection classes: registers the connection's sockets with
    the request being sent, and says when it is connecting."""

    sock: Any

    def _new_conn(self) -> Any:
        # urllib3's method that opens the TCP socket, before TLS or a proxy tunnel.
        sock = super()._new_conn()  # type: ignore[misc]
        _watch(sock)
        return sock

    def connect(self) -> None:
        watch = _current.get()
        if watch is None:
            super().connect()  # type: ignore[misc]
            return
        watch.connecting(True)
        try:
            super().connect()  # type: ignore[misc]
        finally:
            watch.connecting(False)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _watch(self.sock)  # a kept-alive connection (a new one registers as it connects)
        super().request(*args, **kwargs)  # type: ignore[misc]


_watched_classes: dict[type, type] = {}
_Class = TypeVar("_Class", bound=type)


def _watched(cls: _Class) -> _Class:
    if issubclass(cls, _WatchedConnection):
        return cls
    watched = _watched_classes.get(cls)
    if watched is None:
        watched = _watched_classes.setdefault(cls, type(cls.__name__, (_WatchedConnection, cls), {}))
    return cast(_Class, watched)  # a subclass of cls


class DeadlineAdapter(HTTPAdapter):
    """requests' ``HTTPAdapter`` that holds a request whose ``timeout`` is a urllib3
    ``Timeout`` with a ``total`` to that many seconds, all of it: connecting, sending,
    the headers and (unless streamed) the body. Other timeouts are applied as usual."""

    def get_connection_with_tls_context(
        self, request: Any, verify: Any, proxies: Any = None, cert: Any = None
    ) -> Any:
        # An HTTP(S)ConnectionPool, as requests' PoolManager makes them (the stubs say
        # ConnectionPool, which has no ConnectionCls).
        pool = cast(
            HTTPConnectionPool,
            super().get_connection_with_tls_context(request, verify, proxies=proxies, cert=cert),
        )
        pool.ConnectionCls = _watched(pool.ConnectionCls)
        return pool

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> requests.Response:
        options: dict[str, Any] = dict(
            stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
        )
        total = timeout.total if isinstance(timeout, Timeout) else None
        # None or Timeout.DEFAULT_TIMEOUT (urllib3's sentinel): no total, no deadline.
        if not isinstance(total, int | float):
            return super().send(request, **options)
        watch = _Watch()
        token = _current.set(watch)
        timer = threading.Timer(total, watch.expire)
        timer.daemon = True
        timer.name = "airtable-request-deadline"
        timer.start()
        try:
            return self._send_watched(watch, total, request, options)
        finally:
            timer.cancel()
            watch.end()
            _current.reset(token)

    def _send_watched(
        self, watch: _Watch, total: float, request: requests.PreparedRequest, options: dict[str, Any]
    ) -> requests.Response:
        try:
            response = super().send(request, **options)
            if not options["stream"]:
                # Session.send reads the body right after; read it here, within the deadline.
                response.content  # noqa: B018
        except Exception as exc:
            watch.end()  # decided now: the timer cannot claim a failure that came first
            # A timeout of urllib3's own (connect, read) stands as it is.
            if not watch.interrupted or isinstance(exc, requests.exceptions.Timeout):
                raise
            raise _exceeded(watch, total, request) from exc
        watch.end()
        if watch.interrupted:
            # An answer cut short can look whole: http.client takes the end of the
            # connection for the end of the headers, and of a body without a length.
            response.close()
            raise _exceeded(watch, total, request)
        return response


def _exceeded(watch: _Watch, total: float, request: requests.PreparedRequest) -> requests.exceptions.Timeout:
    if watch.while_connecting:
        message = f"not connected within the request's deadline of {total:g}s"
        return ConnectDeadlineExceeded(message, request=request)
    message = f"no complete answer within the request's deadline of {total:g}s"
    return RequestDeadlineExceeded(message, request=request)

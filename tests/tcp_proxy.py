"""A TCP proxy on loopback that a test can cut and restore, to make a database "go away"
for a process that connects through it."""

from __future__ import annotations

import contextlib
import socket
import threading


def _port_sharing_socket() -> socket.socket:
    """A socket that may bind a port the proxy's other such socket holds (SO_REUSEPORT): only
    a socket of the same user that sets it too could share the port, which the servers the
    tests meet do not do."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


class TcpProxy:
    """Its port is held from construction to :meth:`close`: before :meth:`start` and while
    cut, a socket bound there and not listening makes the kernel refuse connections, and no
    other process can take the port before the proxy listens there (again)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._placeholder = _port_sharing_socket()
        self._placeholder.bind(("127.0.0.1", 0))
        self.port: int = self._placeholder.getsockname()[1]
        self._lock = threading.Lock()
        self._connections: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None

    def start(self) -> None:
        listener = _port_sharing_socket()
        # Its connections in TIME_WAIT keep no later server of the port's (once closed) out.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._accept_thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._accept_thread.start()

    def cut(self) -> None:
        """Stop listening (new connections are refused) and reset every open one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            connections, self._connections = self._connections, []
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def restore(self) -> None:
        self.start()

    def close(self) -> None:
        """Cut, and let the port go."""
        self.cut()
        self._placeholder.close()

    def retarget(self, target_host: str, target_port: int) -> None:
        """Connections made from now on go to another server (a failover behind one
        address); those already open stay with the old one until either side ends them."""
        self.target = (target_host, target_port)

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._connections += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._relay, args=(source, sink, upstream), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, upstream: socket.socket) -> None:
        """Pass what ``source`` sends on to ``sink`` until either side ends, or
        :meth:`_passes` stops it (``upstream``: the server's side of the pair)."""
        try:
            while data := source.recv(65536):
                if not self._passes(data, source, upstream):
                    break  # not passed on; the finally drops both sockets
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _passes(self, data: bytes, source: socket.socket, upstream: socket.socket) -> bool:
        """Whether ``data`` from ``source`` goes on; a subclass that drops answers says no."""
        return True

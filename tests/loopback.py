"""A TCP listener on loopback for tests that need a server misbehaving in a set way: it
accepts each connection on a thread of its own, counts it, and hands it to ``handle``."""

from __future__ import annotations

import socket
import threading


class LoopbackListener:
    """Accepts connections on ``127.0.0.1`` (a free port) until :meth:`stop`; each one is
    counted and given to :meth:`handle` on its own thread (closed when ``handle`` returns)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self.connections = 0
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def handle(self, connection: socket.socket, index: int) -> None:
        """What the server does with connection number ``index`` (from 0); subclasses say."""

    def stopping(self, seconds: float) -> bool:
        """Wait up to ``seconds``; whether :meth:`stop` was called meanwhile."""
        return self._stopping.wait(seconds)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            index, self.connections = self.connections, self.connections + 1
            thread = threading.Thread(target=self._serve, args=(connection, index), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, connection: socket.socket, index: int) -> None:
        with connection:
            self.handle(connection, index)

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._listener.close()

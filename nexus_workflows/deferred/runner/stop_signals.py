"""SIGTERM and SIGINT: the first stops claiming and gives attempts the grace, a second
stops at once.

The Python-level handler runs in the main thread between two of its bytecodes, possibly
while that thread holds a lock: inside ``Event.clear()`` or at the end of
``Event.wait()`` on the very event a stop must set. Setting it from the handler would
wait for that lock forever (the runner then never stops). So the handler only puts the
signal on a :class:`queue.SimpleQueue`, whose ``put`` is documented as reentrant, and
a watcher thread does the rest: logging and ``request_stop()``.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger("nexus_workflows.deferred.runner")


class StopSignals:
    """While installed (main thread only), SIGTERM/SIGINT call ``request_stop()`` (from
    a watcher thread), and ``request_stop(now=True)`` once ``stop_requested()`` is
    already true."""

    def __init__(
        self, request_stop: Callable[..., None], stop_requested: Callable[[], bool], grace: float
    ) -> None:
        self.request_stop = request_stop
        self.stop_requested = stop_requested
        self.grace = grace
        self._previous: dict[int, Any] = {}
        self._received: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._watcher: threading.Thread | None = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._watcher = threading.Thread(target=self._watch, name="nexus-workflows-signals", daemon=True)
        self._watcher.start()
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        if self._watcher is not None:
            self._received.put(None)
            self._watcher.join(5.0)
            self._watcher = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # No lock, no logging here: see the module's docstring.
        self._received.put(signum)

    def _watch(self) -> None:
        while (signum := self._received.get()) is not None:
            self.stopping(signum)

    def stopping(self, signum: int) -> None:
        """What a received signal does (in the watcher thread)."""
        name = signal.Signals(signum).name
        if self.stop_requested():
            logger.warning("second %s: stopping now", name)
            self.request_stop(now=True)
        else:
            logger.info("%s: no new work is claimed; in-flight attempts have %gs to finish", name, self.grace)
            self.request_stop()

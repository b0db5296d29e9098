"""SIGTERM and SIGINT: the first stops claiming and gives attempts the grace, a second
stops at once."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger("nexus_workflows.deferred.runner")


class StopSignals:
    """While installed (main thread only), SIGTERM/SIGINT call ``request_stop()``, and
    ``request_stop(now=True)`` once ``stop_requested()`` is already true."""

    def __init__(
        self, request_stop: Callable[..., None], stop_requested: Callable[[], bool], grace: float
    ) -> None:
        self.request_stop = request_stop
        self.stop_requested = stop_requested
        self.grace = grace
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stop_requested():
            logger.warning("second %s: stopping now", name)
            self.request_stop(now=True)
        else:
            logger.info("%s: no new work is claimed; in-flight attempts have %gs to finish", name, self.grace)
            self.request_stop()

"""Benchmark child processes end with the process that started them.

``benchmarks/compare`` runs a script per measurement, and each script starts a worker. Killed
(Ctrl-C, ``kill``), a parent used to leave its child running: a worker left behind keeps
claiming the next measurement's jobs. Linux's parent-death signal sends the child SIGTERM (a
runner's graceful stop) as soon as its parent is gone, whatever killed the parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess``: the child gets SIGTERM when this process ends
    (``None`` off Linux, where the child is left to the caller's ``stop``)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def arm() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm

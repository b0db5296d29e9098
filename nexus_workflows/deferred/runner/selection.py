"""What a runner takes, and how it names itself."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence

from nexus_workflows.exceptions import UnknownQueue
from nexus_workflows.tasks import running as tasks_running


def selection(
    kinds: Sequence[str] | None, queues: Sequence[str] | None, deferred: list[str]
) -> tuple[list[str], list[str] | None]:
    """(workflow kinds, Django task queues or None for all) a runner takes: everything by
    default; only what was named when kinds or queues were."""
    allowed = tasks_running.configured_queues()
    if kinds is None and queues is None:
        return deferred, allowed
    unknown = [] if allowed is None else sorted(set(queues or ()) - set(allowed))
    if unknown:
        # The names given are input (CLI arguments): counted, never echoed. The
        # configured queues are settings, fine to list.
        raise UnknownQueue(
            f"{len(unknown)} of the queue names given is not allowed by any Tasks backend of "
            f"nexus_workflows; allowed queues (their QUEUES): {', '.join(allowed or ()) or 'none'}"
        )
    return sorted(set(kinds or ())), sorted(set(queues or ()))


def worker_id() -> str:
    """This runner in a task's ``worker_ids``: host, process and a random part (a pid is
    reused after a restart), at most 64 characters."""
    return f"{socket.gethostname()[:40]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

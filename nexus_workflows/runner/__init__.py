"""The runner behind ``manage.py runworkflows``: claims due deferred work and runs it.

One runner is one process with a main thread and a few helpers:

* the **main thread** claims batches of due (and stale) work, hands them to the workers,
  writes every outcome (fenced on the claim), and purges expired rows in small batches;
* **worker threads** (``CONCURRENCY``) run ``prepare``; ``save(patch)`` writes from there;
* a **heartbeat thread** refreshes ``heartbeat_at`` of everything the runner holds, so a
  slow but live attempt is never reclaimed, and only a dead runner's work goes stale;
* on PostgreSQL, a **listener thread** wakes the main thread on ``NOTIFY``; it proves
  that wake-ups arrive, and while they do not the main thread polls every
  ``WAKEUP_FALLBACK_POLL_INTERVAL`` instead of ``POLL_INTERVAL`` (see :mod:`nexus_workflows.wakeup`).

Any number of runners may share one database: claims are compare-and-set updates, so
no item is run twice at once. When the database goes away, the runner keeps what it has
not yet written, waits, reconnects and carries on. Nothing a workflow raises, and nothing
one outcome's write raises, ends the main loop: only a signal (or ``request_stop``) does.

The parts, each in its own module: :mod:`.loop` (the :class:`Runner` and its main loop),
:mod:`.ledger` (what it holds, by stage), :mod:`.capacity` (how much to claim),
:mod:`.pool` (the sync worker threads), :mod:`.heartbeat`, :mod:`.outcomes` (the outcome
writer and its batching), :mod:`.reclaim` (the crash-loop guard), :mod:`.backoff`
(outages) and :mod:`.shutdown` (the order of a stop).
"""

from .loop import Runner
from .stats import RunStats
from .unavailable import DATABASE_UNAVAILABLE

__all__ = ["DATABASE_UNAVAILABLE", "RunStats", "Runner"]

"""The runner behind ``manage.py runworkflows``: claims due deferred work and runs it.

One runner is one process with a main thread and a few helpers:

* the **main thread** claims batches of due (and stale) work, hands them to the workers,
  writes every outcome (fenced on the claim), and purges expired rows in small batches;
* **worker threads** (``CONCURRENCY``) run sync prepares, and **one event loop thread**
  runs ``async def`` prepares (up to ``ASYNC_CONCURRENCY`` at once);
* **journal writer threads** write every ``save(patch)`` of both, batched and fenced,
  within ``DB_CONNECTIONS`` connections in all;
* a **heartbeat thread** refreshes ``heartbeat_at`` of everything the runner holds, so a
  slow but live attempt is never reclaimed, and only a dead runner's work goes stale;
* on PostgreSQL, a **listener thread** wakes the main thread on ``NOTIFY`` (and names a
  row inserted alone, which the main thread claims by id); it proves that wake-ups
  arrive, and while they do not the main thread polls every
  ``WAKEUP_FALLBACK_POLL_INTERVAL`` instead of ``POLL_INTERVAL`` (see
  :mod:`nexus_workflows.deferred.wakeup`).

Any number of runners may share one database: claims are compare-and-set updates, so
no item is run twice at once. When the database goes away, the runner keeps what it has
not yet written, waits, reconnects and carries on. Nothing a workflow raises, and nothing
one outcome's write raises, ends the main loop: only a signal (or ``request_stop``) does.

The parts, each in its own module: :mod:`.loop` (the :class:`Runner` and its main loop),
:mod:`.ledger` (what it holds, by stage), :mod:`.lanes` (sync and async work, claimed
each as far as it has room, and the wake-up claim by id), :mod:`.capacity` (how much to
claim), :mod:`.pool` (the sync worker threads), :mod:`.async_pool` (the event loop of
``async def`` prepares), :mod:`.journal` (every ``save()``, batched and fenced, over
``DB_CONNECTIONS``), :mod:`.heartbeat`, :mod:`.outcomes` (the outcome writer and its
batching), :mod:`.reclaim` (the crash-loop guard), :mod:`.backoff` (outages),
:mod:`.dead_connections` (the TCP settings ``runworkflows`` gives its connections, so a
silent network drops them within a bound), :mod:`.stop_signals`, :mod:`.schedule` and
:mod:`.shutdown` (the order of a stop).
"""

from nexus_workflows.deferred.runner.loop import Runner
from nexus_workflows.deferred.runner.stats import RunStats
from nexus_workflows.deferred.runner.unavailable import DATABASE_UNAVAILABLE

__all__ = ["DATABASE_UNAVAILABLE", "RunStats", "Runner"]

"""Every setting of nexus_workflows and its default, read lazily.

Projects configure the app with one dict in their settings::

    NEXUS_WORKFLOWS = {"RETENTION": 2 * 86_400, "CONCURRENCY": 8}

Values are read on each access (not copied at import time), so ``override_settings``
works in tests and a settings module may be imported after this one. Invalid values are
reported by the system checks in :mod:`nexus_workflows.checks`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings

SETTINGS_NAME = "NEXUS_WORKFLOWS"

DEFAULTS: dict[str, Any] = {
    # Seconds that done and abandoned deferred work (and finished or failed
    # fire-and-forget jobs) are kept after their last update. This is also the dedupe
    # horizon: within it, enqueueing the same key again does nothing.
    "RETENTION": 86_400,
    # Seconds without a heartbeat after which processing work is presumed to belong to
    # a dead runner and is reclaimed (the reclaim counts as an attempt).
    "STALE_AFTER": 300,
    # Seconds between heartbeats of a runner for the work it holds. Must be well under
    # STALE_AFTER so that a slow but live attempt is never reclaimed.
    "HEARTBEAT_INTERVAL": 30,
    # Seconds a runner sleeps when no work is due. On PostgreSQL an enqueue also wakes
    # runners at once through LISTEN/NOTIFY (see WAKEUP), so this is only a fallback.
    "POLL_INTERVAL": 1.0,
    # Attempts of sync prepares (and Django tasks) a runner executes at the same time
    # (threads).
    "CONCURRENCY": 4,
    # Attempts of `async def` prepares a runner executes at the same time, all on one
    # event loop of its own (no thread per attempt).
    "ASYNC_CONCURRENCY": 100,
    # Database connections a runner uses for its own work, whatever its concurrency:
    # claims and outcomes (one), heartbeats (one), the wake-up LISTEN (one, on
    # PostgreSQL) and the journal writers (the rest) through which every save() goes.
    # A prepare that uses the ORM itself costs a connection of its thread on top.
    "DB_CONNECTIONS": 8,
    # Seconds between purges of expired done/abandoned work.
    "SWEEP_INTERVAL": 60,
    # Most rows one claim query takes. A runner claims ahead of its free threads only
    # while attempts are quick (at most 50 ms of work per thread by its own measure, see
    # runner/capacity.py), so slow work is shared fairly. For quick work, fewer and larger
    # claims: 300 drained no-op work 1.4-1.7x faster than 100; 200-400 were alike.
    "BATCH_SIZE": 300,
    # Most rows one purge statement deletes; the runner interleaves purge batches with
    # its work so a large backlog never stalls it. A batch the database cancels
    # (statement_timeout) halves the runner's batches for a while (purge_batches.py).
    "PURGE_BATCH_SIZE": 1000,
    # Seconds one purge batch should take at most: the runner purges between its claims,
    # so due work waits while a batch runs. Batches are sized to it (never more than
    # PURGE_BATCH_SIZE rows): slow deletes (big journals, a delete trigger, slow storage)
    # make them smaller, not longer. Plain rows are far quicker: 1,000 take 20-30 ms.
    "PURGE_BATCH_SECONDS": 0.5,
    # Seconds in-flight attempts may finish after SIGTERM/SIGINT before their claims
    # are released for another runner.
    "SHUTDOWN_GRACE": 30,
    # PostgreSQL only: enqueue sends NOTIFY and idle runners LISTEN, so new work
    # starts within milliseconds instead of at the next poll.
    "WAKEUP": True,
    # PostgreSQL only: the Django database alias whose connection runners LISTEN on; None
    # means the runner's own database. Behind a pooler in transaction mode (PgBouncer),
    # point it at an alias that connects straight to the same PostgreSQL database: LISTEN
    # is session state, and a pooler loses it.
    "WAKEUP_DATABASE": None,
    # Seconds a runner sleeps between polls while its wake-ups do not arrive (it proves
    # them with a NOTIFY to itself after every LISTEN, and says so when they fail), and
    # while its listener waits for the lock that makes enqueues notify (wakeup.py).
    "WAKEUP_FALLBACK_POLL_INTERVAL": 0.1,
    # Seconds the endpoint of `runworkflows --metrics-port` waits for a connection's
    # request (or for the client to take the answer) before dropping it: each connection
    # holds a thread, and one that sends nothing would hold it for good. A scrape sends its
    # request at once; computing the answer does not count.
    "METRICS_IDLE_TIMEOUT": 10,
    # Connections the endpoint of `runworkflows --metrics-port` serves at once (a thread
    # each); at the cap the oldest one that has not sent its request yet is shut to make
    # room, and a new one is closed at once only when every slot is answering.
    # Prometheus scrapes one at a time per server.
    "METRICS_MAX_CONNECTIONS": 16,
    # django-rq queue used by fire-and-forget workflows.
    "RQ_QUEUE": "default",
    # --- Airtable helpers (nexus_workflows.airtable); the API key is the Django setting
    # (or environment variable) AIRTABLE_API_KEY, never part of this dict.
    # Base URL of the Airtable API; None means pyairtable's https://api.airtable.com.
    "AIRTABLE_ENDPOINT_URL": None,
    # Requests one helper call makes at most (the first one plus retries).
    "AIRTABLE_MAX_ATTEMPTS": 3,
    # Seconds to wait after HTTP 429 when Airtable gives no Retry-After: its penalty.
    "AIRTABLE_RATE_LIMIT_DELAY": 30,
    # Seconds before the first retry of another transient failure; doubles per retry,
    # plus up to 50% jitter.
    "AIRTABLE_RETRY_BASE_DELAY": 1,
    # Longest Retry-After waited in-process; a longer one ends the call at once with a
    # transient error, leaving the wait to the workflow's retry schedule. Waited with up to
    # AIRTABLE_RETRY_BASE_DELAY of jitter on top.
    "AIRTABLE_MAX_RETRY_AFTER": 60,
    # Seconds after a call's first attempt within which its retries must start: a wait
    # that would end later ends the call with its last failure (transient), leaving the
    # rest to the workflow's retry schedule. The last attempt runs its AIRTABLE_TIMEOUT.
    "AIRTABLE_RETRY_DEADLINE": 120,
    # Seconds one request may take as a whole (connecting, sending, the answer's headers
    # and body), however its answer trickles in: one number, or (connect, read) for a
    # connect within `connect` and the whole request within connect + read.
    "AIRTABLE_TIMEOUT": (5, 30),
    # Requests per period the Airtable helpers send to one base, across every process
    # of the database: a (limit, period seconds) pair, or None for no limit. Airtable
    # allows 5 per second per base and answers a sixth with 429 and a 30 s penalty.
    "AIRTABLE_RATE_LIMIT": (5, 1),
    # Seconds a request of the Airtable helpers waits for a slot of its base's window
    # before failing with RateLimitTimeout (transient: a deferred workflow retries).
    "AIRTABLE_RATE_LIMIT_TIMEOUT": 60,
    # PHI token maps: region (ISO 3166 code) assumed for phone numbers written without
    # a country code.
    "PHI_DEFAULT_REGION": "MX",
    # PHI token maps: seconds a process keeps a conversation's map cached, and how many
    # maps it keeps (least recently used go first).
    "PHI_CACHE_TTL": 60,
    "PHI_CACHE_SIZE": 500,
    # PHI token maps: secret for the lookup-key HMAC (at least 32 characters, not the
    # SECRET_KEY). Unset with DEBUG on: derived from SECRET_KEY, with a warning.
    "PHI_HMAC_KEY": None,
    # PHI token maps: Fernet keys for the stored surfaces, newest first (a list, or one
    # comma-separated string). New surfaces use the first; older keys only decrypt
    # until `manage.py rotate_phi_keys` has run. Unset with DEBUG on: derived, as above.
    "PHI_ENCRYPTION_KEYS": (),
    # PHI token maps and sealed fire-and-forget values: pad plaintexts to 64-byte
    # multiples before encryption, so a ciphertext's length does not tell a value's.
    # False while processes of a version before padding (2026-12) still run: they
    # cannot read padded ciphertexts (both formats are always read).
    "PHI_PADDING": True,
}


class AppSettings:
    """Attribute access to the ``NEXUS_WORKFLOWS`` dict with defaults filled in."""

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"{SETTINGS_NAME} has no setting {name!r}")
        return self.user_settings().get(name, DEFAULTS[name])

    @staticmethod
    def user_settings() -> dict[str, Any]:
        value = getattr(django_settings, SETTINGS_NAME, None)
        return value if isinstance(value, dict) else {}


app_settings = AppSettings()

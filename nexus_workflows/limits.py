"""Sizes shared by the models and the validation that runs before the app is loaded."""

from datetime import timedelta

KIND_MAX_LENGTH = 100
# The kind column: a workflow kind (at most KIND_MAX_LENGTH) or a Django task's import path.
KIND_COLUMN_LENGTH = 255
QUEUE_NAME_MAX_LENGTH = 100
BACKEND_ALIAS_MAX_LENGTH = 100
# A Django task's error keeps the end of its traceback, where the cause is.
TRACEBACK_MAX_LENGTH = 20_000
DEDUPE_KEY_MAX_LENGTH = 255
LAST_ERROR_MAX_LENGTH = 2000
HISTORY_MAX_ENTRIES = 25
# An attempt that failed only because the database was unreachable is released (attempt
# unchanged) at most this many times; after that it counts as a failed attempt.
OUTAGE_RELEASES_MAX = 5
# Claims of one item lost before their attempt started (they cost no attempt) allowed
# before the crash-loop guard abandons it.
UNSTARTED_LOSSES_MAX = 10
#: Longest ``delay`` (and fire-and-forget ``job_timeout``) accepted: ten years, far
#: inside what datetimes and Redis can represent.
MAX_DELAY = timedelta(days=3653)

#: Flow control's largest concurrency cap: slots are numbered in a small-integer column,
#: and a claim looks the free ones up among them.
FLOW_CONCURRENCY_MAX = 10_000
#: The largest rate limit: a window keeps one row per start of its period.
RATE_LIMIT_MAX = 10_000
#: The longest rate-limit period (and ``rate_limited`` timeout): a year. Beyond it a window
#: is no rate limit, and its stamps would leave the database's range.
RATE_PERIOD_MAX = timedelta(days=366)

#: Most threads a runner starts for CONCURRENCY (``runworkflows --concurrency``) and most
#: connections for DB_CONNECTIONS (one journal-writer thread each). All are started up
#: front, each thread with a stack of its own, so an absurd value fails at once with
#: "can't start new thread"; and a database runs out of connections long before this
#: (PostgreSQL allows 100 by default, and a sync prepare using the ORM holds one more).
MAX_THREADS = 1024
#: Most rows of one batch: BATCH_SIZE, PURGE_BATCH_SIZE, ASYNC_CONCURRENCY (a claim takes
#: up to the larger of BATCH_SIZE and the concurrency) and ``rotate_phi_keys --batch-size``.
#: A batch's ids travel as bind parameters of one statement, and PostgreSQL with Django's
#: server-side binding (the README's fast-enqueue configuration) takes at most 65,535 per
#: statement; a heartbeat names every item a runner holds (up to CONCURRENCY +
#: ASYNC_CONCURRENCY + 2 x BATCH_SIZE), which this keeps under half of that.
MAX_BATCH_SIZE = 10_000

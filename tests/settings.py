"""Settings for the test suite: the development project plus a test-only app.

The database comes from DATABASE_URL like everywhere else; bin/test runs the suite once
on SQLite and once on PostgreSQL.
"""

import json
import os
from pathlib import Path

from nexus_workflows.fire_and_forget.embedded import embedded_queue
from project.settings import *  # noqa: F403
from project.settings import BASE_DIR, DATABASES, INSTALLED_APPS, env

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

# Tests start runner processes that must see the test database, so SQLite's test
# database is a file, not the in-memory default.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    _test_database = Path(os.environ.get("SQLITE_TEST_NAME", BASE_DIR / "var" / "test-db.sqlite3"))
    _test_database.parent.mkdir(parents=True, exist_ok=True)
    DATABASES["default"]["TEST"] = {"NAME": str(_test_database)}

# "direct" connects straight to PostgreSQL (a runner's WAKEUP_DATABASE in the tests of
# wake-ups behind PgBouncer) while "default" may go through the pooler (the PgBouncer leg of
# bin/test). Under pytest it is the same test database as "default".
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["direct"] = {
        **env.db("DIRECT_DATABASE_URL", default=env.str("DATABASE_URL")),
        "TEST": {"MIRROR": "default"},
    }
    # "prepared": the same database through psycopg's prepared statements (Django's
    # server-side binding and a prepare threshold), the README's fast-enqueue configuration;
    # direct, as a pooler in transaction mode before PgBouncer 1.21 breaks prepared statements.
    DATABASES["prepared"] = {
        **DATABASES["direct"],
        "OPTIONS": {
            **DATABASES["direct"].get("OPTIONS", {}),
            "server_side_binding": True,
            "prepare_threshold": 5,
        },
    }

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Runner processes started by tests get their settings through this variable. Fixed,
# test-only PHI keys come first so that every test process (and every process a test
# starts) encrypts and hashes alike; pytest-django runs tests with DEBUG off.
NEXUS_WORKFLOWS = {
    "PHI_HMAC_KEY": "test-only-phi-lookup-key-not-for-real-data",
    "PHI_ENCRYPTION_KEYS": ["dGVzdC1vbmx5LXBoaS1mZXJuZXQta2V5LTAwMDAwMDE="],
    **json.loads(os.environ.get("NEXUS_WORKFLOWS_JSON", "{}")),
}

# Fire-and-forget tests use their own Redis database (flushed by the `rq_redis` fixture),
# never REDIS_URL, which may point at a server that matters. An empty REDIS_TEST_URL
# selects the embedded mode (used by the subprocess that proves it needs no Redis).
REDIS_TEST_URL = os.environ.get("REDIS_TEST_URL", "redis://127.0.0.1:6379/14")
RQ_QUEUES = (
    {name: {"URL": REDIS_TEST_URL, "DEFAULT_TIMEOUT": 60} for name in ("default", "urgent")}
    if REDIS_TEST_URL
    else {"default": embedded_queue(DEFAULT_TIMEOUT=60)}
)

# A second Tasks backend whose OPTIONS ask for retries (the way Django 6.0 and the backport
# configure them), and queues that runners can be limited to.
TASKS = {
    "default": {
        "BACKEND": "nexus_workflows.tasks.DeferredBackend",
        "QUEUES": ["default", "emails", "reports"],
    },
    "retrying": {
        "BACKEND": "nexus_workflows.tasks.DeferredBackend",
        "OPTIONS": {"RETRY_SCHEDULE": [0.01, 0.01]},
    },
}

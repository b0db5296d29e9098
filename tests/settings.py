"""Settings for the test suite: the development project plus a test-only app.

The database comes from DATABASE_URL like everywhere else; bin/test runs the suite once
on SQLite and once on PostgreSQL.
"""

import json
import os

from project.settings import *  # noqa: F403
from project.settings import BASE_DIR, DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

# Tests start runner processes that must see the test database, so SQLite's test
# database is a file, not the in-memory default.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["TEST"] = {
        "NAME": os.environ.get("SQLITE_TEST_NAME", str(BASE_DIR / "var" / "test-db.sqlite3")),
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

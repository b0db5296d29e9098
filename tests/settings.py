"""Settings for the test suite: the development project plus a test-only app.

The database comes from DATABASE_URL like everywhere else; bin/test runs the suite once
on SQLite and once on PostgreSQL.
"""

import json
import os
from pathlib import Path

from project.settings import *  # noqa: F403
from project.settings import BASE_DIR, DATABASES, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.testapp"]

# Tests start runner processes that must see the test database, so SQLite's test
# database is a file, not the in-memory default.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    _test_database = Path(os.environ.get("SQLITE_TEST_NAME", BASE_DIR / "var" / "test-db.sqlite3"))
    _test_database.parent.mkdir(parents=True, exist_ok=True)
    DATABASES["default"]["TEST"] = {"NAME": str(_test_database)}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Runner processes started by tests get their settings through this variable.
NEXUS_WORKFLOWS = json.loads(os.environ.get("NEXUS_WORKFLOWS_JSON", "{}"))

"""Settings for benchmark runs: the development project plus the benchmark workflows,
with DEBUG off as in production (DEBUG records every query and slows everything down)."""

import os

os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "benchmark-only-secret-key-not-for-production-use-0123456789")
# Throw-away PHI keys: the project's checks require them when DEBUG is off, and the
# benchmarks store no PHI. The runner processes inherit them from the environment.
if "PHI_HMAC_KEY" not in os.environ and "PHI_ENCRYPTION_KEYS" not in os.environ:
    import secrets

    from cryptography.fernet import Fernet

    os.environ["PHI_HMAC_KEY"] = secrets.token_urlsafe(48)
    os.environ["PHI_ENCRYPTION_KEYS"] = Fernet.generate_key().decode()

from project.settings import *  # noqa: F403
from project.settings import DATABASES, INSTALLED_APPS, NEXUS_WORKFLOWS, env

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.benchapp"]

# Behind PgBouncer (benchmarks/compare --via-pgbouncer): DATABASE_URL goes through the
# pooler, WAKEUP_DATABASE_URL (when set) straight to PostgreSQL for the runner's LISTEN.
if env.str("WAKEUP_DATABASE_URL", default=""):
    DATABASES["wakeup"] = env.db("WAKEUP_DATABASE_URL")
    NEXUS_WORKFLOWS = {**NEXUS_WORKFLOWS, "WAKEUP_DATABASE": "wakeup"}

# "prepared": the same database through psycopg's prepared statements, the README's opt-in
# (Django's server-side binding and a prepare threshold); the limit section enqueues on both
# (benchmarks/routers.py). Nothing else connects to it.
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["prepared"] = {
        **DATABASES["default"],
        "OPTIONS": {
            **DATABASES["default"].get("OPTIONS", {}),
            "server_side_binding": True,
            "prepare_threshold": 5,
        },
    }

# Runner settings of one measurement (benchmarks/io_workload.py), as JSON.
if os.environ.get("BENCH_NEXUS_WORKFLOWS"):
    import json

    NEXUS_WORKFLOWS = {**NEXUS_WORKFLOWS, **json.loads(os.environ["BENCH_NEXUS_WORKFLOWS"])}

# The kinds with flow limits (benchmarks/flow_control.py sets BENCH_FLOW=1, and its runner
# processes inherit it); left out elsewhere so other runners claim only what they did.
if os.environ.get("BENCH_FLOW") == "1":
    INSTALLED_APPS.append("benchmarks.flowapp")

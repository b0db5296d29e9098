"""Settings for benchmark runs: the development project plus the benchmark workflows,
with DEBUG off as in production (DEBUG records every query and slows everything down)."""

import os

os.environ.setdefault("DEBUG", "false")
os.environ.setdefault("SECRET_KEY", "benchmark-only-secret-key-not-for-production-use-0123456789")

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks.benchapp"]

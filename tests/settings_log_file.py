"""The test settings plus a project's log file for ``nexus_workflows``: a stock
``FileHandler`` opened at the first line it takes (``delay``), at the path in
``NEXUS_TEST_LOG_FILE``. A path whose directory is missing makes that first line raise
the system's ``FileNotFoundError``, as a log directory removed or never made does."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import LOGGING

LOGGING = {
    **LOGGING,
    "handlers": {
        **LOGGING["handlers"],
        "file": {
            "class": "logging.FileHandler",
            "filename": os.environ["NEXUS_TEST_LOG_FILE"],
            "delay": True,
        },
    },
    "loggers": {
        **LOGGING["loggers"],
        "nexus_workflows": {**LOGGING["loggers"]["nexus_workflows"], "handlers": ["console", "file"]},
    },
}

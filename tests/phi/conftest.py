"""Fixtures for the PHI token map tests.

The token cache lives as long as the process, while each test's rows are rolled back or
flushed; every test therefore starts and ends with an empty cache and a fresh keyring.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator

import pytest

from nexus_workflows.phi.cache import token_cache
from nexus_workflows.phi.keys import reset_keyring


@pytest.fixture(autouse=True)
def _fresh_phi_state() -> Iterator[None]:
    token_cache.clear()
    reset_keyring()
    yield
    token_cache.clear()
    reset_keyring()


@pytest.fixture
def code() -> str:
    """A conversation code no other test uses."""
    return f"conv-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def phi_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every record of the ``nexus_workflows`` loggers, DEBUG included.

    The project's LOGGING stops those loggers from propagating to the root logger, where
    caplog listens, so its handler is attached to them directly.
    """
    logger = logging.getLogger("nexus_workflows")
    previous = logger.level
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.DEBUG)
    caplog.handler.setLevel(logging.DEBUG)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.setLevel(previous)

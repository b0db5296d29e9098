"""Fixtures of the Airtable tests: a live emulator on loopback and settings pointing at it.

Delays are shrunk to milliseconds through the settings, the same way a deployment would
tune them; the code paths are the production ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS

from nexus_workflows.airtable import set_eval_mode
from nexus_workflows.flow.committed import run_committed
from nexus_workflows.models import FlowWindowSlot
from tests.airtable.emulator import API_KEY, AirtableEmulator

BASE = "appTestBase0000001"

FAST_SETTINGS = {
    # The per-base window stays on (every request takes a start, as in production), wide
    # enough not to slow the tests; test_rate_limit.py runs Airtable's own 5 per second.
    "AIRTABLE_RATE_LIMIT": (10_000, 1),
    "AIRTABLE_RATE_LIMIT_DELAY": 0.05,
    "AIRTABLE_RETRY_BASE_DELAY": 0.01,
    "AIRTABLE_TIMEOUT": (2, 5),
}


@pytest.fixture(autouse=True)
def _windows_in_the_database(db: None) -> Iterator[None]:
    """Every helper request takes a start of its base's window, a database row. Inside
    the test's transaction that start is committed on a connection of its own (it counts
    a request made whatever the transaction does: flow.committed), so the test's rollback
    keeps it: drop the windows the test used, the same way."""
    yield
    run_committed(DEFAULT_DB_ALIAS, FlowWindowSlot.objects.filter(name__startswith="airtable:").delete)


@pytest.fixture
def emulator() -> Iterator[AirtableEmulator]:
    server = AirtableEmulator()
    yield server
    server.stop()


@pytest.fixture
def airtable_config(settings: Any) -> Callable[..., None]:
    """``airtable_config(url, **overrides)``: point the helpers at ``url`` with fast delays."""

    def configure(url: str, **overrides: Any) -> None:
        settings.AIRTABLE_API_KEY = API_KEY
        settings.NEXUS_WORKFLOWS = {
            **settings.NEXUS_WORKFLOWS,
            **FAST_SETTINGS,
            "AIRTABLE_ENDPOINT_URL": url,
            **overrides,
        }

    return configure


@pytest.fixture
def airtable(emulator: AirtableEmulator, airtable_config: Callable[..., None]) -> AirtableEmulator:
    """The emulator, with the helpers configured to use it."""
    airtable_config(emulator.url)
    return emulator


@pytest.fixture
def refused() -> Iterator[AirtableEmulator]:
    """An emulator whose port is bound but not listening: connections are refused."""
    server = AirtableEmulator(listening=False)
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _eval_mode_off() -> Iterator[None]:
    set_eval_mode(False)
    yield
    set_eval_mode(False)

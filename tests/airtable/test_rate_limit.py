"""The Airtable helpers take a start of ``airtable:<base id>`` before every request."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from nexus_workflows.airtable import add_record, get_records
from nexus_workflows.airtable.client import base_of
from nexus_workflows.models import FlowWindowSlot
from tests.airtable.conftest import BASE
from tests.airtable.emulator import AirtableEmulator


def test_requests_to_one_base_keep_to_its_window(
    emulator: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    airtable_config(emulator.url, AIRTABLE_RATE_LIMIT=(5, 1))
    started = time.monotonic()
    for number in range(11):
        add_record(BASE, "Patients", {"Name": f"n{number}"})
    elapsed = time.monotonic() - started
    assert len(emulator.requests) == 11
    assert elapsed >= 1.9  # 5 at once, 5 a second later, the eleventh a second after that
    assert FlowWindowSlot.objects.filter(name=f"airtable:{BASE}").count() == 5


def test_a_long_formula_sent_as_a_post_takes_one_start(
    emulator: AirtableEmulator, airtable_config: Callable[..., None]
) -> None:
    # pyairtable sends a GET whose URL is too long as a POST by calling request() again.
    airtable_config(emulator.url, AIRTABLE_RATE_LIMIT=(100, 3600))  # each start takes a row of its own
    emulator.add(BASE, "Patients", {"Name": "a"})

    assert get_records(BASE, "Patients", formula={"Name": "x" * 17_000}) == []

    assert [(r.method, r.record_id) for r in emulator.requests] == [("POST", "listRecords")]
    started = FlowWindowSlot.objects.filter(name=f"airtable:{BASE}", started_at__year__gt=1971)
    assert started.count() == 1


def test_none_turns_the_window_off(emulator: AirtableEmulator, airtable_config: Callable[..., None]) -> None:
    airtable_config(emulator.url, AIRTABLE_RATE_LIMIT=None)
    for number in range(8):
        add_record(BASE, "Patients", {"Name": f"n{number}"})
    assert not FlowWindowSlot.objects.filter(name=f"airtable:{BASE}").exists()


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("https://api.airtable.com/v0/appABC123/Patients", "appABC123"),
        ("http://127.0.0.1:9999/v0/appX/tbl/rec1", "appX"),
        ("https://api.airtable.com/v0/meta/bases", None),
    ],
)
def test_base_of(url: str, base: Any) -> None:
    assert base_of(url) == base

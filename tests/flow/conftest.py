"""Fixtures of the flow-control tests."""

from __future__ import annotations

import pytest

from nexus_workflows.flow import claiming


@pytest.fixture
def long_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rest bound of a minute: a claim made after the first finds the kind resting
    however loaded the machine is, and only the events under test end the rest."""
    monkeypatch.setattr(claiming, "_REST", 60.0)

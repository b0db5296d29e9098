"""nexus_workflows.redaction: what is shown of an error without the reveal permission."""

from __future__ import annotations

import pytest

from nexus_workflows.redaction import error_type


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("UpstreamError: HTTP 503 for María López", "UpstreamError"),
        ("requests.exceptions.HTTPError: 500 Server Error", "requests.exceptions.HTTPError"),
        ("WorkerLost: the runner died", "WorkerLost"),
        ("KeyError", "KeyError"),
        ("María López: no slot", "error"),  # not a type name: nothing of it is shown
        ("patient 5512345678 missing", "error"),
        ("", ""),
        ("   ", ""),
        (None, ""),
    ],
)
def test_error_type_never_shows_the_message(text: str | None, shown: str) -> None:
    assert error_type(text) == shown

"""The return value ``task_finished`` carries is the one ``get_result()`` reads later."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from nexus_workflows.tasks.compat import task_finished
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_signalled_return_value_is_the_stored_one() -> None:
    """The signal carried {1: ...} while get_result() gave {"1": ...}."""
    result = tasks.keyed_by_numbers.enqueue("k")
    signalled: list[Any] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        signalled.append(task_result.return_value)

    task_finished.connect(receive)
    try:
        call_command("runworkflows", "--once", stdout=io.StringIO())
    finally:
        task_finished.disconnect(receive)
    result.refresh()
    assert signalled == [result.return_value] == [{"1": "k", "pair": [2, 3]}]

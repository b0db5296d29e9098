"""The JSON-array updates claims and outcome writes make inside one UPDATE."""

from __future__ import annotations

import pytest

from nexus_workflows import enqueue
from nexus_workflows.deferred.expressions import JSONAppend, JSONDropLast
from nexus_workflows.models import DeferredWork

pytestmark = pytest.mark.django_db


def test_append_and_drop_last_on_json_arrays(register_workflow: object) -> None:
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind  # type: ignore
    work = DeferredWork.objects.filter(pk=int(enqueue(kind, {"key": "a"})))
    work.update(worker_ids=JSONAppend("worker_ids", "runner-1"))
    work.update(worker_ids=JSONAppend("worker_ids", "runner-2"))
    error = {"exception_class_path": "builtins.ValueError", "traceback": "é\n"}
    work.update(errors=JSONAppend("errors", error))
    row = work.get()
    assert row.worker_ids == ["runner-1", "runner-2"]
    assert row.errors == [error]
    work.update(worker_ids=JSONDropLast("worker_ids"))
    assert work.get().worker_ids == ["runner-1"]
    work.update(worker_ids=JSONDropLast("worker_ids"))
    work.update(worker_ids=JSONDropLast("worker_ids"))  # an empty array stays empty
    assert work.get().worker_ids == []

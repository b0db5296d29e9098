"""One state machine: nothing but :mod:`nexus_workflows.deferred.transitions` writes a row's status
(read from the source with ``ast``), and each transition keeps its compare-and-set."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from nexus_workflows import enqueue
from nexus_workflows.clock import database_now
from nexus_workflows.deferred import transitions
from nexus_workflows.models import DeferredWork, Status
from tests.structure import module_files

WRITES = {"update", "create", "bulk_create", "update_or_create", "get_or_create", "bulk_update"}
STATE_MACHINE = "nexus_workflows.deferred.transitions"

def status_writes(path: Path) -> list[int]:
    """Lines that write a row's status: ``status=`` in a write call (``update``, ``create``
    …), a ``"status": Status.X`` dict entry, or ``….status = Status.X``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
            found += [node.lineno for keyword in node.keywords if keyword.arg == "status"]
        elif isinstance(node, ast.Dict):
            found += [
                node.lineno
                for key, value in zip(node.keys, node.values, strict=True)
                if isinstance(key, ast.Constant) and key.value == "status" and _is_status(value)
            ]
        elif isinstance(node, ast.Assign) and _is_status(node.value):
            found += [
                node.lineno for t in node.targets if isinstance(t, ast.Attribute) and t.attr == "status"
            ]
    return sorted(found)


def _is_status(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Status"


def test_only_the_state_machine_writes_status() -> None:
    writers = {name: lines for name, path in module_files().items() if (lines := status_writes(path))}
    assert STATE_MACHINE in writers  # the check finds status writes where they are
    others = {name: lines for name, lines in writers.items() if name != STATE_MACHINE}
    assert others == {}


def test_the_status_check_sees_each_spelling(tmp_path: Path) -> None:
    source = tmp_path / "module.py"
    source.write_text(
        "rows.update(status=Status.DONE)\n"
        "changes = {'status': Status.PENDING}\n"
        "work.status = Status.ABANDONED\n"
        "rows.filter(status=Status.DONE).count()\n"
    )
    assert status_writes(source) == [1, 2, 3]


@pytest.fixture
def kind(register_workflow: Any) -> str:
    return register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind


@pytest.mark.django_db(transaction=True)
def test_revive_and_run_now_compare_and_set_on_the_status(kind: str) -> None:
    abandoned = DeferredWork.objects.filter(pk=enqueue(kind, {"key": "a"}))
    pending = DeferredWork.objects.filter(pk=enqueue(kind, {"key": "p"}, delay=3600))
    abandoned.update(status=Status.ABANDONED, attempt=2, last_error="boom")
    assert transitions.run_now(abandoned) == 0  # only pending work is made due
    assert transitions.revive(pending) == 0  # only abandoned work is revived
    assert transitions.revive(abandoned, history=[{"event": "revived"}]) == 1
    assert abandoned.values_list("status", "attempt", "last_error").get() == (Status.PENDING, 0, "")
    assert transitions.run_now(pending) == 1
    # Due by the database's clock now (an hour from now before the call).
    assert DeferredWork.objects.due(database_now("default")).filter(pk=pending.get().pk).exists()


@pytest.mark.django_db(transaction=True)
def test_purge_deletes_only_rows_still_expired(kind: str) -> None:
    done = DeferredWork.objects.filter(pk=enqueue(kind, {"key": "d"}))
    revived = DeferredWork.objects.filter(pk=enqueue(kind, {"key": "r"}))
    DeferredWork.objects.update(status=Status.DONE, updated_at=done.get().updated_at - timedelta(days=30))
    expired = DeferredWork.objects.expired(done.get().updated_at + timedelta(days=1))
    ids = list(expired.values_list("pk", flat=True))
    revived.update(status=Status.PENDING)  # changed after the purge read its ids
    assert transitions.purge(expired, ids) == 1
    assert list(DeferredWork.objects.values_list("pk", flat=True)) == [revived.get().pk]

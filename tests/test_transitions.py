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


# --- An outcome written again after its answer was lost ----------------------------------
# An outage just after the commit of an attempt's outcome: the write went through, its
# answer never arrived, and the runner writes it again. That write matches nothing (the
# row is no longer processing); it must still count as written by this claim, not as a
# lost claim. (tests/faults/test_lost_answers.py loses the answer in a real crash.)

FAILURE_WRITES: dict[str, Any] = {
    "rescheduled": lambda work: transitions.reschedule(
        work, delay=timedelta(minutes=1), error="Upstream: timeout"
    ),
    "released": lambda work: transitions.release_attempt(
        work, delay=timedelta(seconds=1), reason="database unavailable", error="OperationalError: gone"
    ),
    "abandoned": lambda work: transitions.abandon(work, error="Upstream: refused", reason="permanent error"),
}
ENDS_AS = {
    "rescheduled": (Status.PENDING, 1),
    "released": (Status.PENDING, 0),
    "abandoned": (Status.ABANDONED, 0),
}


def claimed_one(kind: str) -> Any:
    from nexus_workflows.deferred.claims import Claimer

    (work,) = Claimer(kinds=[kind], using="default").claim_due(1)
    return work


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("returning", [True, False], ids=["update-returning", "update-then-read"])
@pytest.mark.parametrize("outcome", list(FAILURE_WRITES))
def test_a_failure_written_again_by_its_own_claim_is_written_not_lost(
    kind: str, monkeypatch: Any, outcome: str, returning: bool
) -> None:
    if not returning:
        monkeypatch.setattr(transitions, "can_return_from_update", lambda using: False)
    rows = DeferredWork.objects.filter(pk=enqueue(kind, {"key": "a"}))
    work = claimed_one(kind)
    write = FAILURE_WRITES[outcome]
    assert write(work) is True  # committed; in an outage its answer would be lost here
    first = rows.values().get()
    work.finished_at = None

    assert write(work) is True  # written again: it matches nothing, and is no lost claim
    assert rows.values().get() == first  # written once: one history entry, one attempt counted
    assert (first["status"], first["attempt"]) == ENDS_AS[outcome]
    assert work.finished_at == first["finished_at"]  # abandoned: what task_finished carries


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("outcome", ["rescheduled", "released"])
def test_a_pending_write_cannot_be_told_once_another_claim_took_the_row(kind: str, outcome: str) -> None:
    """Pending work may be claimed again at once: the new claim's token replaces ours, and
    the write sent again cannot tell that it went through. It stays counted lost."""
    rows = DeferredWork.objects.filter(pk=enqueue(kind, {"key": "a"}))
    work = claimed_one(kind)
    write = FAILURE_WRITES[outcome]
    assert write(work) is True
    rows.update(next_attempt_at=database_now("default") - timedelta(seconds=1))
    again = claimed_one(kind)
    assert write(work) is False
    assert transitions.reschedule(again, delay=timedelta(minutes=1), error="Again: failed") is True
    assert write(work) is False  # pending with the other claim's token: not ours
    assert rows.values_list("status", "attempt").get() == (Status.PENDING, ENDS_AS[outcome][1] + 1)


@pytest.mark.django_db(transaction=True)
def test_a_revived_row_is_no_claims_abandon_and_a_new_abandon_is_its_own(kind: str) -> None:
    rows = DeferredWork.objects.filter(pk=enqueue(kind, {"key": "a"}))
    work = claimed_one(kind)
    abandon = FAILURE_WRITES["abandoned"]
    assert abandon(work) is True
    assert transitions.revive(rows) == 1  # the operator revives it: the claim is cleared
    assert rows.values_list("status", "claim_token").get() == (Status.PENDING, "")
    assert abandon(work) is False
    again = claimed_one(kind)
    assert abandon(again) is True
    assert abandon(work) is False  # abandoned again, by another claim
    assert abandon(again) is True


@pytest.mark.django_db(transaction=True)
def test_claims_released_at_shutdown_again_are_counted_released(kind: str) -> None:
    from nexus_workflows.deferred.claims import Claimer

    ids = [int(enqueue(kind, {"key": str(n)})) for n in range(3)]
    works = Claimer(kinds=[kind], using="default").claim_due(3)
    assert transitions.release(works) == 3
    assert transitions.release(works) == 3  # sent again after a lost answer
    DeferredWork.objects.filter(pk=ids[0]).update(claim_token="another claim's")
    assert transitions.release(works) == 2
    assert set(DeferredWork.objects.values_list("status", flat=True)) == {Status.PENDING}
    # A fence never matches a kept token: each needs the status "processing" too.
    assert not DeferredWork.objects.held(works[1].claim_token).exists()


# --- The done-write's RETURNING -------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.needs("update_returning")
def test_a_done_write_returns_the_stored_finish_of_task_rows_only(kind: str) -> None:
    """Only a Django task's ``finished_at`` is read (its ``task_finished`` carries it):
    the done-write of a claim of workflow rows returns their ids alone (a no-op drain
    paid for converting and keeping a time per item that nothing read)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from nexus_workflows.deferred.claims import Claimer
    from tests.testapp import tasks

    enqueue(kind, {"key": "w"})
    tasks.add.enqueue(1, 2)
    workflow = claimed_one(kind)
    (task,) = Claimer(kinds=[], queues=["default"], using="default").claim_due(1)
    with CaptureQueriesContext(connection) as queries:
        assert transitions.finish_done([workflow, task]) == ([workflow, task], [])
    returned = [query["sql"].rsplit("RETURNING", 1)[1] for query in queries if "RETURNING" in query["sql"]]
    # One statement per claim, the workflow's first.
    assert ["finished_at" in columns for columns in returned] == [False, True]
    stored = dict(DeferredWork.objects.values_list("pk", "finished_at"))
    assert (workflow.finished_at, task.finished_at) == (None, stored[task.id])
    assert stored[workflow.id] is not None

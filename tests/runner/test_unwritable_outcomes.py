"""Outcomes the database keeps refusing for a reason other than an outage (a project's
trigger or constraint, a strict SQL mode): a success is recorded as a failure in its
place; a failure no write gets in is given up (its claim left to go stale), so a runner
neither holds it for ever nor, with ``--once``, runs for ever; ``--once`` then exits 1.
Real ``runworkflows`` processes and real triggers (``write_blocker``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from nexus_workflows import enqueue
from nexus_workflows.database_errors import is_database_unavailable
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.models import DeferredWork, Status
from tests import conftest
from tests.processes import ManagePy, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.2, "STALE_AFTER": 30, "SHUTDOWN_GRACE": 2}
#: What a project's MariaDB trigger typically raises: a plain SIGNAL, error 1644, which
#: mysqlclient files under OperationalError (the runner took it for an outage).
PLAIN_SIGNAL = "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused by the test'"


# A trigger's plain SIGNAL is MariaDB's: that case is deselected elsewhere, not skipped.
@pytest.fixture(params=["constraint error", pytest.param("plain SIGNAL", marks=pytest.mark.mysql)])
def refusal(request: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "plain SIGNAL":
        monkeypatch.setattr(conftest, "MARIADB_REFUSAL", PLAIN_SIGNAL)
    return str(request.param)


def test_once_ends_and_exits_1_when_outcomes_cannot_be_written(write_blocker: Any, refusal: str) -> None:
    """On the old code the process never ended: each refused write was retried for ever
    (on MariaDB a trigger's plain SIGNAL was even taken for an outage)."""
    refused = enqueue("test-outcomes", {"key": "refused", "outcome": "permanent"})
    unstorable = enqueue("test-outcomes", {"key": "unstorable", "outcome": "done"})
    fine = enqueue("test-outcomes", {"key": "fine", "outcome": "done"})
    write_blocker.install(
        "(NEW.dedupe_key = 'refused' AND NEW.status <> 'processing') "
        "OR (NEW.dedupe_key = 'unstorable' AND NEW.status = 'done')"
    )
    args = ["--once", "--kind", "test-outcomes", "--concurrency", "1"]
    process = ManagePy("runworkflows", *args, settings=SETTINGS)
    try:
        code = process.wait(timeout=60)
        output = process.output()
    finally:
        process.close()
    assert code == 1, output
    assert "runworkflows --once: 1 done, 0 rescheduled, 1 abandoned, 0 reclaimed, 1 unwritten" in output
    assert "1 outcome(s) could not be written" in output
    assert f"test-outcomes #{refused} attempt 1 of 4: its outcome could not be written (" in output
    assert "refused by the test" not in output  # the database's text: by type only
    # The failure no write got in: still processing, no longer heart-beaten.
    assert DeferredWork.objects.get(pk=refused).status == Status.PROCESSING
    # The success the database refused: abandoned in its place, by the write's error type.
    work = DeferredWork.objects.get(pk=unstorable)
    assert work.status == Status.ABANDONED
    assert work.last_error.startswith("OutcomeNotStored: the attempt succeeded, but the database refused")
    assert DeferredWork.objects.get(pk=fine).status == Status.DONE


def test_a_given_up_item_no_longer_holds_its_lane(register_workflow: Any, write_blocker: Any) -> None:
    """A runner with one thread and slow work (no prefetch): on the old code the refused
    outcome stayed held, filling the lane's one slot for ever: nothing after it was claimed."""
    ran = threading.Event()

    def prepare(trigger: Any, checkpoints: Any, save: Any) -> None:
        ran.set()
        time.sleep(0.1)  # not quick: no prefetch, the lane holds at most its one slot's item
        raise ValueError("upstream said no")

    kind = register_workflow(prepare, retry_schedule=[60]).kind
    blocked = enqueue(kind, {"key": "refused"})
    write_blocker.install("NEW.dedupe_key = 'refused' AND NEW.status <> 'processing'")
    with override_settings(NEXUS_WORKFLOWS=SETTINGS):
        runner = Runner(kinds=[kind], concurrency=1, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            wait_for(ran.is_set, timeout=30, what="the first attempt")
            later = [enqueue(kind, {"key": f"later-{n}"}) for n in range(3)]
            wait_for(
                lambda: DeferredWork.objects.filter(pk__in=later, attempt=1).count() == 3,
                timeout=30,
                what="the later items to run",
            )
        finally:
            runner.request_stop()
            thread.join(30)
            connection.close()
    assert not thread.is_alive()
    assert DeferredWork.objects.get(pk=blocked).status == Status.PROCESSING
    assert runner.stats.unwritten == 1


@pytest.mark.mysql
def test_a_mariadb_statement_refusal_is_no_outage(
    write_blocker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trigger's SIGNAL arrives as OperationalError (1644): the server answered, so no
    outage (the runner held the outcome and waited for the database for ever)."""
    work_id = enqueue("test-outcomes", {"key": "a", "outcome": "done"})
    monkeypatch.setattr(conftest, "MARIADB_REFUSAL", PLAIN_SIGNAL)
    write_blocker.install("NEW.dedupe_key = 'a'")
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the driver's error, whatever its class
        DeferredWork.objects.filter(pk=work_id).update(status=Status.DONE)
    assert type(raised.value).__name__ == "OperationalError"
    assert not is_database_unavailable(raised.value)


def test_the_give_up_is_logged_once_at_error_and_by_type(
    register_workflow: Any, write_blocker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    enqueue(kind, {"key": "refused", "phone": "+52 55 1234 5678"})
    write_blocker.install("NEW.dedupe_key = 'refused' AND NEW.status <> 'processing'")
    with override_settings(NEXUS_WORKFLOWS=SETTINGS), caplog.at_level(logging.INFO, logger="nexus_workflows"):
        runner = Runner(kinds=[kind], once=True, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            wait_for(lambda: not thread.is_alive(), timeout=60, what="--once to end")
        finally:
            runner.request_stop(now=True)
            thread.join(30)
            connection.close()
    stats = runner.stats
    assert (stats.done, stats.abandoned, stats.unwritten) == (0, 0, 1)
    gave_up = [line for line in caplog.records if "its outcome could not be written" in line.getMessage()]
    assert [line.levelno for line in gave_up] == [logging.ERROR]
    assert "1234" not in caplog.text
    assert "refused by the test" not in caplog.text

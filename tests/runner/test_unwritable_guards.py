"""A reclaimed item whose crash-loop guard write (its lost attempt's history) the database
keeps refusing for a reason other than an outage (a project's trigger): given up after
``GUARD_WRITES_MAX`` refusals, as an unwritable outcome is, said once at ERROR; a
``--once`` runner then ends. Real runner, real trigger (``write_blocker``)."""

from __future__ import annotations

import io
import logging
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from nexus_workflows import enqueue
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.deferred.runner.reclaim import GUARD_WRITES_MAX
from nexus_workflows.models import DeferredWork, Status
from tests.processes import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = {"POLL_INTERVAL": 0.05, "HEARTBEAT_INTERVAL": 0.2, "STALE_AFTER": 30, "SHUTDOWN_GRACE": 2}


def stale_rows(kind: str, *keys: str) -> list[int]:
    """Rows of ``kind`` a runner that died claimed: processing, last heart-beaten long ago."""
    ids = [int(enqueue(kind, {"key": key})) for key in keys]
    assert len(Claimer(kinds=[kind], using="default").claim_due(len(ids))) == len(ids)
    DeferredWork.objects.filter(pk__in=ids).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    return ids


def test_a_guard_write_refused_for_good_is_given_up_once(
    register_workflow: Any, write_blocker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """On the old code the refused guard write was retried at every turn for ever: the
    item stayed held and ``--once`` never ended (this test timed out)."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    refused, fine = stale_rows(kind, "refused", "fine")
    # The reclaim's own claim passes (it leaves the history alone); the guard's write is
    # the history alone: refused.
    write_blocker.install("NEW.dedupe_key = 'refused' AND NEW.history <> OLD.history")
    logged = caplog.at_level(logging.DEBUG, logger="nexus_workflows")
    with override_settings(NEXUS_WORKFLOWS=SETTINGS), logged:
        runner = Runner(kinds=[kind], once=True, install_signal_handlers=False)
        thread = threading.Thread(target=runner.run, name="test-runner")
        thread.start()
        try:
            wait_for(lambda: not thread.is_alive(), timeout=30, what="--once to end")
        finally:
            runner.request_stop(now=True)
            thread.join(30)
            connection.close()
    stats = runner.stats
    assert (stats.reclaimed, stats.done, stats.unwritten, stats.unwritten_guards) == (2, 1, 0, 1)
    gave_up = [record for record in caplog.records if "could not be written" in record.getMessage()]
    assert [record.levelno for record in gave_up] == [logging.ERROR]
    assert f"{kind} #{refused} " in gave_up[0].getMessage()
    assert "reclaim" in gave_up[0].getMessage()
    retried = [record for record in caplog.records if "writing its reclaim failed" in record.getMessage()]
    assert len(retried) == GUARD_WRITES_MAX - 1
    assert "blocked by the test" not in caplog.text  # the database's text: by type only
    # Given up: still processing under the reclaim's claim, no longer heart-beaten.
    assert DeferredWork.objects.get(pk=refused).status == Status.PROCESSING
    assert DeferredWork.objects.get(pk=fine).status == Status.DONE


def test_once_names_a_given_up_guard_write_as_such(register_workflow: Any, write_blocker: Any) -> None:
    """``--once`` exits 1 naming what was given up: a crash-loop guard write, counted, not
    an outcome. On the old code: "1 outcome(s) could not be written", and the summary's
    "1 unwritten" (an outcome's word), though every outcome was written."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    _, fine = stale_rows(kind, "refused-key", "fine")
    write_blocker.install("NEW.dedupe_key = 'refused-key' AND NEW.history <> OLD.history")
    out = io.StringIO()
    with override_settings(NEXUS_WORKFLOWS=SETTINGS), pytest.raises(CommandError) as raised:
        call_command("runworkflows", "--once", "--kind", kind, stdout=out)
    summary = "runworkflows --once: 1 done, 0 rescheduled, 0 abandoned, 2 reclaimed, 1 unwritten guard(s)"
    assert out.getvalue().strip() == summary
    message = str(raised.value)
    assert message.startswith(
        "1 crash-loop guard write(s) (a reclaimed item's lost attempt) could not be written "
        "(the database refused them, not an outage"
    ), message
    assert "outcome(s)" not in message
    assert "refused-key" not in message  # counts only, never a dedupe key
    assert DeferredWork.objects.get(pk=fine).status == Status.DONE

"""Demo workflows a newcomer can enqueue and watch succeed, retry and be abandoned.

The runner imports this module at start-up (every installed app's ``workflows`` module
is discovered), so ``manage.py runworkflows`` knows these kinds with no extra set-up.

Try::

    python manage.py workflows enqueue demo-greet '{"visit": 1}'
    python manage.py workflows enqueue demo-flaky '{"visit": 2, "failures": 2}'
    python manage.py workflows enqueue demo-doomed '{"visit": 3}'
    python manage.py runworkflows

``demo-triage-projection`` writes to Airtable: set ``AIRTABLE_API_KEY`` and
``DEMO_AIRTABLE_BASE_ID`` (a base with a ``Patients`` table that has a ``Patient ID``
field, and a ``Triage`` table with ``Submission``, ``Priority`` and a ``Patient`` link
field), then::

    python manage.py workflows enqueue demo-triage-projection \
        '{"submission": "S-1001", "patient": "P-17", "priority": "urgent"}'

``demo-notify`` is fire-and-forget: without REDIS_URL it runs at enqueue (embedded
mode); with REDIS_URL set, ``python manage.py rqworker --with-scheduler`` runs it::

    python manage.py workflows enqueue demo-notify '{"visit": 4}'
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings

from nexus_workflows import PermanentError, workflow
from nexus_workflows.airtable import LinkSpec, add_linked_record, get_record_by_filter

logger = logging.getLogger(__name__)

# Retry schedules are in minutes; the demo's are short so that a retry shows up in
# seconds: 6 s, then 12 s.
DEMO_SCHEDULE = [0.1, 0.2]


def by_visit(trigger: dict[str, Any]) -> str:
    return str(trigger["visit"])


@workflow("demo-greet", dedupe_key=by_visit, retry_schedule=DEMO_SCHEDULE)
def greet(
    trigger: dict[str, Any], checkpoints: dict[str, Any], save: Callable[[dict[str, Any]], None]
) -> None:
    """Succeeds at once."""
    time.sleep(0.2)  # pretend to call something


class FlakyUpstream(Exception):
    """A transient failure: the retry schedule is walked."""


@workflow("demo-flaky", dedupe_key=by_visit, retry_schedule=DEMO_SCHEDULE)
def flaky(
    trigger: dict[str, Any], checkpoints: dict[str, Any], save: Callable[[dict[str, Any]], None]
) -> None:
    """Fails ``failures`` times (default 1), then succeeds; its first step is journalled
    so that retries skip it."""
    if not checkpoints.get("fetched"):
        save({"fetched": True})  # durable before the next, failing, call
    failures_so_far = checkpoints.get("failures_so_far", 0)
    if failures_so_far < trigger.get("failures", 1):
        save({"failures_so_far": failures_so_far + 1})
        raise FlakyUpstream(f"upstream timed out (failure {failures_so_far + 1})")


@workflow("demo-doomed", dedupe_key=by_visit, retry_schedule=DEMO_SCHEDULE)
def doomed(
    trigger: dict[str, Any], checkpoints: dict[str, Any], save: Callable[[dict[str, Any]], None]
) -> None:
    """Fails permanently: abandoned after one attempt, waiting for an operator."""
    raise PermanentError("the upstream rejected the request (HTTP 422)")


@workflow("demo-exhausted", dedupe_key=by_visit, retry_schedule=DEMO_SCHEDULE)
def exhausted(
    trigger: dict[str, Any], checkpoints: dict[str, Any], save: Callable[[dict[str, Any]], None]
) -> None:
    """Always fails transiently: walks the whole schedule, then is abandoned."""
    raise FlakyUpstream("upstream still down")


PATIENTS_TABLE = "Patients"
TRIAGE_TABLE = "Triage"


def by_submission(trigger: dict[str, Any]) -> str:
    return str(trigger["submission"])


@workflow("demo-triage-projection", dedupe_key=by_submission, retry_schedule=DEMO_SCHEDULE)
def triage_projection(
    trigger: dict[str, Any], checkpoints: dict[str, Any], save: Callable[[dict[str, Any]], None]
) -> None:
    """Projects a triage submission into Airtable: finds the patient's record and creates
    a triage record linked to it, once per submission.

    Airtable has no idempotent create, so the journal makes one: ``create_sent`` is saved
    before the create is sent, and the new record's id right after. A retry that finds
    ``create_sent`` without an id cannot know whether the last create reached Airtable
    (a lost answer), so it looks the submission up before creating again.

    Failures need no handling here: Airtable's 4xx answers are permanent (abandoned at
    once), outages and a patient record that does not exist yet walk the schedule.
    """
    if checkpoints.get("triage_record_id"):
        return  # projected by an earlier attempt
    base_id = settings.DEMO_AIRTABLE_BASE_ID
    submission = {"Submission": str(trigger["submission"])}
    if checkpoints.get("create_sent"):
        existing = get_record_by_filter(base_id, TRIAGE_TABLE, submission)
        if existing is not None:
            save({"triage_record_id": existing["id"]})
            return
    save({"create_sent": True})  # durable before the create leaves
    record = add_linked_record(
        base_id,
        TRIAGE_TABLE,
        {**submission, "Priority": str(trigger.get("priority", "routine"))},
        LinkSpec(table=PATIENTS_TABLE, formula={"Patient ID": str(trigger["patient"])}, field="Patient"),
    )
    if record is None:  # eval mode: nothing was written
        logger.info("triage projection rehearsed in eval mode; nothing written")
        return
    save({"triage_record_id": record["id"]})


@workflow("demo-notify", dedupe_key=by_visit)
def notify(trigger: dict[str, Any]) -> None:
    """Fire-and-forget (no retry schedule): runs once on an RQ worker, or at enqueue in
    the embedded mode. Enqueueing the same visit again within RETENTION does nothing."""
    time.sleep(0.1)  # pretend to send a notification
    logger.info("demo-notify: notification sent")  # no trigger data in logs

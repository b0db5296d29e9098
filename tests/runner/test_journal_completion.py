"""A save is completed once: by its writer, or by a stop that gave up on that writer
(:meth:`JournalWriter._fail_in_hand`), whichever comes first; the other changes nothing.
Driven step by step (the writer's ``_write`` called where a stuck writer would finish),
on a real database."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

import pytest

from nexus_workflows import ClaimLost, enqueue
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.runner.journal import JournalWriter
from nexus_workflows.deferred.runner.journal_saves import Save
from nexus_workflows.deferred.transitions import ClaimedWork
from nexus_workflows.models import DeferredWork

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def work(register_workflow: Any) -> ClaimedWork:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    enqueue(kind, {"key": "a"})
    (claimed,) = Claimer(kinds=[kind], using="default").claim_due(1)
    return claimed


def in_hand(writer: JournalWriter, batch: list[Save]) -> None:
    """As a writer thread holds ``batch`` while it writes it."""
    writer._in_hand[threading.get_ident()] = batch


def test_a_save_its_writer_wrote_is_not_failed_by_a_later_stop(work: ClaimedWork) -> None:
    """The writer wrote the save and handed its answer to the attempt's loop; the stop
    came before that loop ran the answer and before the writer let go of the batch. On
    the old code the stop overwrote the answer: the attempt's await raised ClaimLost
    ("the runner stopped") for a save that was written."""
    writer = JournalWriter("default", 1)
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        save = Save(work, {"step": 1}, {"step": 1}, future=future, loop=loop)
        writer._write([save])  # written; its answer waits for the loop
        in_hand(writer, [save])
        writer._fail_in_hand()
        assert loop.run_until_complete(future) == {"step": 1}
    finally:
        loop.close()
    assert work.checkpoints == {"step": 1}
    assert DeferredWork.objects.get(pk=work.id).checkpoints == {"step": 1}


def test_a_save_a_stop_failed_keeps_that_answer_when_its_stuck_writer_finishes(work: ClaimedWork) -> None:
    """The stop failed the save (its caller woke to ClaimLost "the runner stopped"); the
    stuck writer's statement then ended (here: its claim was gone). On the old code the
    writer replaced the save's error after its caller had woken, and woke it again."""
    writer = JournalWriter("default", 1)
    save = Save(replace(work, claim_token="another runner's"), {"step": 1}, written=threading.Event())
    in_hand(writer, [save])
    writer._fail_in_hand()
    assert save.written is not None
    assert save.written.is_set()
    told = save.error
    assert isinstance(told, ClaimLost)
    assert "the runner stopped" in str(told)
    writer._write([save])  # the stuck writer finishes
    assert save.error is told

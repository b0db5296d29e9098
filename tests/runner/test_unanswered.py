"""A claim whose answer the network lost: the database ran it (its rows are processing under
the claim's token), then the connection went away before the rows came back. Nothing of
it was handed out, so nothing runs those rows; before, they sat processing, holding their
kind's slots and serial keys, until ``STALE_AFTER`` (five minutes by default) had them
reclaimed. The runner now gives them back at its first turn on which the database
answers (:mod:`nexus_workflows.deferred.runner.unanswered`).

The runner tests go through a loopback proxy that lets the claim's statement (or the
``COMMIT`` of a claim in a transaction) reach PostgreSQL, waits until the server has
answered all of it (``ReadyForQuery``: committed), and drops the answer and the connection.
"""

from __future__ import annotations

import socket
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now

from nexus_workflows import enqueue
from nexus_workflows.clock import database_now
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.runner.unanswered import UnansweredClaims
from nexus_workflows.deferred.transitions import release_unanswered
from nexus_workflows.models import DeferredWork, FlowWindowSlot, Status
from tests.processes import ManagePy, url_of_test_database, wait_for
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.django_db(transaction=True)

# What only a claim's UPDATE writes (on PostgreSQL, Django's Now() is STATEMENT_TIMESTAMP()).
CLAIM_MARKER = b'"claimed_at" = STATEMENT_TIMESTAMP()'
# The server's last message after a statement (then its transaction status, one byte).
READY_FOR_QUERY = b"Z\x00\x00\x00\x05"


class ClaimAnswerDropper(TcpProxy):
    """Once armed, lets the next claim through and drops the answer to it (``then=None``)
    or to the next client message holding ``then`` (a claim's ``COMMIT``), once the server
    has answered it whole; then both sockets of that connection are closed."""

    def __init__(self, target_host: str, target_port: int, *, then: bytes | None = None) -> None:
        super().__init__(target_host, target_port)
        self.then = then
        self.armed = threading.Event()
        self.dropped = threading.Event()
        self._claimed: set[socket.socket] = set()  # upstreams that sent the claim
        self._awaiting: set[socket.socket] = set()  # upstreams whose next answer goes nowhere

    def _passes(self, data: bytes, source: socket.socket, upstream: socket.socket) -> bool:
        if source is not upstream:  # the client's request
            if self.armed.is_set() and CLAIM_MARKER in data:
                self.armed.clear()
                self._claimed.add(upstream)
            if upstream in self._claimed and (self.then is None or self.then in data):
                self._claimed.discard(upstream)
                self._awaiting.add(upstream)  # before the request goes: its answer may be fast
            return True
        if upstream not in self._awaiting:
            return True
        while READY_FOR_QUERY not in data[-6:]:  # the server ran (and committed) it all
            more = upstream.recv(65536)
            if not more:
                break
            data += more
        self._awaiting.discard(upstream)
        self.dropped.set()
        return False  # never passed on; both sockets are closed


def test_rows_a_lost_claim_took_are_pending_due_now_with_their_attempt_unchanged() -> None:
    ids = [enqueue("test-ledger", {"key": str(n)}) for n in range(3)]
    lost = Claimer(kinds=["test-ledger"], using="default").claim_due(2)
    other = Claimer(kinds=["test-ledger"], using="default").claim_due(1)
    assert {w.id for w in lost} | {w.id for w in other} == {int(pk) for pk in ids if pk}

    released = release_unanswered("default", [lost[0].claim_token, "a-token-no-claim-has"])

    assert released == 2
    now = database_now("default")
    for work in lost:
        row = DeferredWork.objects.get(pk=work.id)
        assert (row.status, row.attempt, row.claimed_at, row.heartbeat_at) == (Status.PENDING, 0, None, None)
        assert row.next_attempt_at <= now
    # Another claim's row is not touched; a token given back twice matches nothing.
    assert DeferredWork.objects.get(pk=other[0].id).status == Status.PROCESSING
    assert release_unanswered("default", [lost[0].claim_token]) == 0


def test_a_lost_token_is_given_back_at_every_turn_until_it_settled() -> None:
    now = [100.0]
    unanswered = UnansweredClaims("default", settle=5.0, monotonic=lambda: now[0])
    assert not unanswered
    assert unanswered.give_back() == 0  # nothing lost: no statement
    enqueue("test-ledger", {"key": "1"})
    (work,) = Claimer(kinds=["test-ledger"], using="default").claim_due(1)
    unanswered.add(work.claim_token)

    now[0] += 60.0  # an outage longer than SETTLE: the settling starts at the first give-back
    assert unanswered.give_back() == 1
    assert unanswered  # its statement may still have been running: kept a while
    now[0] += 4.9
    assert unanswered.give_back() == 0
    assert unanswered
    now[0] += 0.2
    assert unanswered.give_back() == 0
    assert not unanswered


def test_a_reclaim_that_raised_is_left_to_go_stale_a_claim_of_due_work_is_noted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given back, a reclaimed row would be claimed as plain due work: past the crash-loop
    guard, and without the history entry of the attempt the reclaim counted lost."""
    from django.db import OperationalError

    from nexus_workflows.deferred import claims

    enqueue("test-ledger", {"key": "stale"})
    (held,) = Claimer(kinds=["test-ledger"], using="default").claim_due(1)
    DeferredWork.objects.filter(pk=held.id).update(heartbeat_at=Now() - timedelta(hours=1))
    enqueue("test-ledger", {"key": "due"})
    noted: list[str] = []
    claimer = Claimer(
        kinds=["test-ledger"], using="default", on_unanswered=lambda token, _reserved: noted.append(token)
    )

    def answer_lost(*args: object, **kwargs: object) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(claims, "claim", answer_lost)
    with pytest.raises(OperationalError):
        claimer.claim_stale(1, stale_after=timedelta(minutes=5))
    assert noted == []
    with pytest.raises(OperationalError):
        claimer.claim_due(1)
    assert len(noted) == (0 if connection.vendor == "sqlite" else 1)


def test_only_a_claim_over_a_network_can_lose_its_answer() -> None:
    """SQLite's answers come from this process: no claim of it is ever unanswered."""
    noted: list[str] = []
    claimer = Claimer(
        kinds=["test-ledger"], using="default", on_unanswered=lambda token, _reserved: noted.append(token)
    )
    claimer.note_unanswered("token", ConnectionError())
    from django.db import OperationalError

    claimer.note_unanswered("token", OperationalError("server closed the connection unexpectedly"))
    expected = [] if connection.vendor == "sqlite" else ["token"]
    assert noted == expected


def _proxied_runner(proxy: TcpProxy, kind: str) -> ManagePy:
    settings = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 120, "SHUTDOWN_GRACE": 1}
    return ManagePy(
        "runworkflows",
        "--kind",
        kind,
        settings=settings,
        database_url=url_of_test_database(port=proxy.port),
    )


@pytest.mark.slow
@pytest.mark.postgresql
@pytest.mark.parametrize(
    ("kind", "then"),
    [
        ("test-ledger", None),  # one UPDATE … RETURNING: the wake-up's claim by id
        ("test-flow-rate", b"COMMIT"),  # a claim and its reserved starts in one transaction
    ],
)
def test_work_a_claim_took_as_its_answer_was_lost_runs_at_once_not_after_stale_after(
    tmp_path: Path, kind: str, then: bytes | None
) -> None:
    settings = connection.settings_dict
    proxy = ClaimAnswerDropper(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432), then=then)
    proxy.start()
    process = _proxied_runner(proxy, kind)
    try:
        process.wait_for_output("runner started")
        proxy.armed.set()
        work_id = enqueue(kind, {"key": "1", "ledger": str(tmp_path / "ledger")})
        wait_for(proxy.dropped.is_set, timeout=30, what="a claim's answer dropped")
        # The claim went through: its row is processing under a token nobody holds.
        wait_for(lambda: DeferredWork.objects.get(pk=work_id).status != Status.PENDING, timeout=5)
        # STALE_AFTER is 120 s: only the give-back runs it this soon.
        wait_for(
            lambda: DeferredWork.objects.get(pk=work_id).status == Status.DONE,
            timeout=30,
            what="the work done",
        )
        assert process.terminate() == 0, process.output()
        output = process.output()
    finally:
        proxy.close()
        process.close()
    assert "gave back 1 item(s) claimed as the database went away" in output, output
    row = DeferredWork.objects.get(pk=work_id)
    # One attempt, done; the lost claim counted no attempt and no lost claim.
    assert (row.attempt, row.lost_unstarted) == (0, 0)
    assert row.history == [], row.history
    assert "runner stopped: 1 done, 0 rescheduled, 0 abandoned, 0 reclaimed" in output, output
    # The lost claim's reserved start was given back with its row: no start of the window is
    # stamped ahead (a reservation not yet started), which would hold the window for its
    # period after RESERVED_FOR (an hour, for one start an hour).
    assert not FlowWindowSlot.objects.filter(started_at__gt=Now()).exists()


def test_a_give_back_the_database_refuses_is_dropped_not_tried_before_every_claim(
    write_blocker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused for another reason than an outage (here a trigger; a lock timeout, say), the
    give-back would fail every turn before its claim: the runner would claim nothing more."""
    from django.test import override_settings

    from nexus_workflows.deferred.runner import Runner

    enqueue("test-ledger", {"key": "1"})
    (work,) = Claimer(kinds=["test-ledger"], using="default").claim_due(1)
    write_blocker.install("NEW.status = 'pending'")
    with override_settings(NEXUS_WORKFLOWS={"POLL_INTERVAL": 0.05}):
        runner = Runner(kinds=["test-ledger"], install_signal_handlers=False)
    runner._unanswered.add(work.claim_token)

    runner._give_back_unanswered()  # the turn goes on to its claim

    assert not runner._unanswered
    assert "could not give back claims whose answer was lost" in caplog.text
    assert DeferredWork.objects.get(pk=work.id).status == Status.PROCESSING  # goes stale, as before

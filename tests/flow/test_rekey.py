"""``rekey``: keys for work enqueued before its kind had them, written beside running claims."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.deferred.registry import Workflow, registry
from nexus_workflows.deferred.transitions import ClaimedWork, abandon, finish_done
from nexus_workflows.exceptions import UnknownWorkflow
from nexus_workflows.flow.keys import flow_key_hashes
from nexus_workflows.flow.rekey import rekey
from nexus_workflows.models import DeferredWork, Status

pytestmark = pytest.mark.django_db(transaction=True)

PHONE = "+5215587314926"


def noop(trigger: Any, checkpoints: Any, save: Any) -> None:
    pass


def claim(kind: str, count: int = 10) -> list[ClaimedWork]:
    return Claimer(kinds=[kind], using="default").claim_due(count)


def redeploy(register_workflow: Callable[..., Workflow], kind: str, **flow: Any) -> Workflow:
    """The kind registered again with other options, as a deploy would."""
    registry.unregister(kind)
    return register_workflow(noop, kind=kind, retry_schedule=[1], **flow)


def run_command(*args: str) -> str:
    out = io.StringIO()
    call_command("workflows", "rekey", *args, stdout=out)
    return out.getvalue()


def to(trigger: Any) -> str:
    return trigger["to"]


def test_a_serial_key_added_by_a_deploy_reaches_the_backlog_and_the_running_row(
    register_workflow: Callable[..., Workflow],
) -> None:
    kind = register_workflow(noop, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": n, "to": "A" if n < 3 else "B"} for n in range(4)])
    (running,) = claim(kind, 1)  # A's first, claimed before the deploy: keyless
    redeploy(register_workflow, kind, serial_key=to, ordered=True)

    result = rekey(kind)

    assert (result.examined, result.rekeyed, result.complete) == (4, 4, True)
    expected = {pk: flow_key_hashes(kind, registry.get(kind).flow, t)[0] for pk, t in _triggers(kind)}
    assert dict(DeferredWork.objects.values_list("pk", "serial_key_hash")) == expected
    # A's later items wait behind the running one; only B's starts.
    (started,) = claim(kind)
    assert DeferredWork.objects.get(pk=started.id).trigger["to"] == "B"
    finish_done([running])
    (next_a,) = claim(kind)
    assert next_a.id == sorted(pk for pk, trigger in _triggers(kind) if trigger["to"] == "A")[1]


def test_rows_with_their_keys_are_not_written_again_and_finished_rows_are_left(
    register_workflow: Callable[..., Workflow],
) -> None:
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(5, 60), rate_key=to).kind
    enqueue_many(kind, [{"key": n, "to": f"S{n % 2}"} for n in range(4)])
    (done,) = claim(kind, 1)
    finish_done([done])
    DeferredWork.objects.filter(pk=done.id).update(rate_key_hash=None)

    result = rekey(kind)

    assert (result.examined, result.rekeyed) == (3, 0)
    assert DeferredWork.objects.get(pk=done.id).rate_key_hash is None


def test_a_changed_rate_key_gives_abandoned_and_pending_rows_the_hashes_an_enqueue_gives_now(
    register_workflow: Callable[..., Workflow],
) -> None:
    kind = register_workflow(noop, retry_schedule=[1], rate_limit=(5, 60), rate_key=to).kind
    enqueue_many(kind, [{"key": n, "to": f"S{n}"} for n in range(3)])
    (work,) = claim(kind, 1)
    assert abandon(work, error="gave up", reason="permanent")
    redeploy(register_workflow, kind, rate_limit=(5, 60), rate_key=lambda t: t["to"].lower())

    assert rekey(kind).rekeyed == 3
    enqueue(kind, {"key": "fresh", "to": "S0"})
    hashes = dict(DeferredWork.objects.values_list("dedupe_key", "rate_key_hash"))
    assert hashes["0"] == hashes["fresh"]
    assert DeferredWork.objects.get(pk=work.id).status == Status.ABANDONED


def test_two_rows_of_one_key_running_side_by_side_key_one_and_name_the_other(
    register_workflow: Callable[..., Workflow],
) -> None:
    kind = register_workflow(noop, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": n, "to": PHONE} for n in range(3)])
    first, second = claim(kind, 2)
    (third,) = DeferredWork.objects.filter(status=Status.PENDING).values_list("pk", flat=True)
    redeploy(register_workflow, kind, serial_key=to)

    result = rekey(kind)

    keyed = DeferredWork.objects.filter(serial_key_hash__isnull=False).values_list("pk", flat=True)
    if connection.features.supports_partial_indexes:
        assert result.held == [second.id]
        assert sorted(keyed) == [first.id, third]
        finish_done([second])
        assert rekey(kind).complete
    else:  # MariaDB: nothing holds a key to one running row (check E009 refuses serial keys)
        assert result.complete
        assert sorted(keyed) == [first.id, second.id, third]


def test_the_command_names_ids_and_counts_and_never_the_trigger_or_the_key(
    register_workflow: Callable[..., Workflow],
) -> None:
    kind = register_workflow(noop, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": n, "to": PHONE} for n in range(2)] + [{"key": 9}])
    claim(kind, 2)
    redeploy(register_workflow, kind, serial_key=to)
    out, err = io.StringIO(), io.StringIO()

    with pytest.raises(CommandError) as raised:
        call_command("workflows", "rekey", kind, stdout=out, stderr=err)

    printed = out.getvalue() + err.getvalue() + str(raised.value)
    assert PHONE not in printed
    assert "4926" not in printed
    nine = DeferredWork.objects.get(dedupe_key="9").pk
    assert f"1 row(s) left as they were, their key function failed: #{nine} (first: " in printed
    assert "serial_key raised KeyError" in printed
    assert "not every unfinished item carries its keys" in printed
    if connection.features.supports_partial_indexes:  # the second running row's key is held
        assert "1 processing row(s) not keyed, another running row of their serial key holds it" in printed
        assert f"rekeyed 1 of 3 unfinished row(s) of {kind}" in printed
    else:
        assert f"rekeyed 2 of 3 unfinished row(s) of {kind}" in printed


def test_a_row_claimed_between_its_read_and_its_write_is_keyed_as_a_running_row(
    register_workflow: Callable[..., Workflow],
) -> None:
    kind = register_workflow(noop, retry_schedule=[1]).kind
    enqueue_many(kind, [{"key": n, "to": f"C{n}"} for n in range(3)])
    claimed: list[ClaimedWork] = []

    def claiming_key(trigger: Any) -> str:
        # A runner claims the rows while rekey computes their keys (after its read).
        if not claimed:
            claimed.extend(claim(kind, 3))
        return trigger["to"]

    redeploy(register_workflow, kind, serial_key=claiming_key)
    result = rekey(kind)

    assert {work.id for work in claimed} == set(DeferredWork.objects.values_list("pk", flat=True))
    assert (result.rekeyed, result.complete) == (3, True)
    rows = DeferredWork.objects.filter(status=Status.PROCESSING, serial_key_hash__isnull=False)
    assert rows.count() == 3


def test_kinds_that_are_not_deferred_workflows_here_are_refused_without_being_repeated(
    register_workflow: Callable[..., Workflow],
) -> None:
    job = register_workflow(lambda trigger: None).kind  # no retry schedule: fire-and-forget
    for kind in (job, PHONE):
        with pytest.raises(UnknownWorkflow) as raised:
            rekey(kind)
        assert kind not in str(raised.value)
        with pytest.raises(CommandError, match="no deferred workflow is registered here") as raised:
            run_command(kind)
        assert kind not in str(raised.value)


def _triggers(kind: str) -> list[tuple[int, Any]]:
    return list(DeferredWork.objects.filter(kind=kind).values_list("pk", "trigger"))

"""Serial and rate keys for work enqueued before its kind had them: ``manage.py workflows
rekey KIND``.

Keys are hashed from the trigger at enqueue (:mod:`nexus_workflows.flow.keys`), so a deploy
that adds a ``serial_key`` or ``rate_key`` leaves the kind's backlog keyless (claimed side
by side, counted in the kind's one window), and a rotated ``PHI_HMAC_KEY`` leaves it under
the old hashes. :func:`rekey` computes the hashes of every row of the kind that can still
run (pending, processing, abandoned) again from its trigger with the kind's current key
functions, and writes those that differ. A hash depends on the trigger only, which never
changes, so no write needs to compare more than the row's status.

* Pending and abandoned rows are written in batches; the ``UPDATE`` re-checks their status,
  so a row a runner claimed meanwhile is left to the processing rule below.
* A processing row is written alone. Its serial key is then held by the unique index
  ``nw_serial_key_running_once``: keying a running row is what stops the next row of its
  key from starting beside it. When another processing row of the key holds the key
  already (both were claimed keyless, side by side), the write is refused; the row is
  named in the result and left for a later run, once one of them has ended.
* A row whose key function fails is left as it is and named by id.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import IntegrityError, router, transaction
from django.db.models import Case, CharField, Value, When
from django.views.decorators.debug import sensitive_variables

from nexus_workflows.deferred.registry import Workflow, registry
from nexus_workflows.exceptions import InvalidFlowKey, UnknownWorkflow
from nexus_workflows.flow.keys import flow_key_hashes
from nexus_workflows.models import DeferredWork, Status

logger = logging.getLogger("nexus_workflows.flow")

#: Rows read (and written) per batch.
BATCH = 500
#: The statuses of rows that can still run: the rows a key matters to.
UNFINISHED = (Status.PENDING, Status.PROCESSING, Status.ABANDONED)
_WAITING = (Status.PENDING, Status.ABANDONED)

Hashes = tuple[str | None, str | None]


@dataclass
class RekeyResult:
    """What :func:`rekey` did. Ids only: never a trigger or a key."""

    kind: str
    #: Unfinished rows read.
    examined: int = 0
    #: Rows whose hashes were written (the others had them already).
    rekeyed: int = 0
    #: Rows whose key function failed: left as they were.
    failed: list[int] = field(default_factory=list)
    #: The first failure's message (``InvalidFlowKey``'s: the kind, the rule and the
    #: exception's type, never the trigger).
    first_error: str = ""
    #: Processing rows whose serial key another processing row holds: run again later.
    held: list[int] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every unfinished row of the kind carries the keys its trigger gives now."""
        return not self.failed and not self.held


def rekeyable_workflow(kind: str) -> Workflow:
    """The deferred workflow registered as ``kind``; raises :class:`UnknownWorkflow` (whose
    message does not repeat the argument, which may be a dedupe key given by mistake)."""
    if kind not in registry.kinds() or not registry.get(kind).is_deferred:
        raise UnknownWorkflow(
            "no deferred workflow is registered here under the kind given: rekey reads the key "
            "functions of a kind this project registers with a retry schedule"
        )
    return registry.get(kind)


# sensitive_variables: an error report of a write that fails in here (a failover, a lock
# wait cut short) shows no frame's variables: the rows read hold triggers (patient data).
@sensitive_variables()
def rekey(kind: str, *, using: str | None = None, batch: int = BATCH) -> RekeyResult:
    """Write the serial and rate key hashes of every unfinished row of ``kind`` that its
    trigger gives under the kind's current registration (and the current ``PHI_HMAC_KEY``).
    Safe beside running runners, and to run again."""
    workflow = rekeyable_workflow(kind)
    using = using or router.db_for_write(DeferredWork)
    result = RekeyResult(kind=kind)
    for rows in _batches(kind, using, batch):
        result.examined += len(rows)
        wanted = _wanted_hashes(workflow, rows, result)
        waiting = {pk: hashes for pk, hashes in wanted.items() if rows[pk][0] in _WAITING}
        running = {pk: hashes for pk, hashes in wanted.items() if rows[pk][0] == Status.PROCESSING}
        written = _write_waiting(using, waiting)
        result.rekeyed += len(written)
        # Rows claimed since they were read (and running ones) are written alone.
        moved = set(waiting) - written
        for pk in sorted(moved | set(running)):
            _write_running(using, pk, wanted[pk], result)
    logger.info(
        "rekey of %s: %d unfinished row(s) read, %d rekeyed, %d failed, %d held back",
        kind,
        result.examined,
        result.rekeyed,
        len(result.failed),
        len(result.held),
    )
    return result


def _batches(kind: str, using: str, size: int) -> Iterator[dict[int, tuple[str, Any, Hashes]]]:
    """The kind's unfinished rows by id, a batch at a time: ``{pk: (status, trigger,
    (serial hash, rate hash))}``."""
    rows = DeferredWork.objects.using(using).filter(kind=kind, status__in=UNFINISHED).order_by("pk")
    after = 0
    while True:
        fields = ("pk", "status", "trigger", "serial_key_hash", "rate_key_hash")
        batch = list(rows.filter(pk__gt=after).values_list(*fields)[:size])
        if not batch:
            return
        after = batch[-1][0]
        yield {pk: (status, trigger, (serial, rate)) for pk, status, trigger, serial, rate in batch}


def _wanted_hashes(
    workflow: Workflow, rows: dict[int, tuple[str, Any, Hashes]], result: RekeyResult
) -> dict[int, Hashes]:
    """The hashes each row's trigger gives now, for the rows that do not have them."""
    wanted: dict[int, Hashes] = {}
    for pk, (_, trigger, stored) in rows.items():
        try:
            hashes = flow_key_hashes(workflow.kind, workflow.flow, trigger)
        except InvalidFlowKey as error:
            result.failed.append(pk)
            result.first_error = result.first_error or str(error)
            continue
        if hashes != stored:
            wanted[pk] = hashes
    return wanted


def _write_waiting(using: str, wanted: dict[int, Hashes]) -> set[int]:
    """Write the hashes of rows still pending or abandoned; the ids that have them now."""
    if not wanted:
        return set()
    rows = DeferredWork.objects.using(using).filter(pk__in=list(wanted))
    waiting = rows.filter(status__in=_WAITING)
    waiting.update(serial_key_hash=_by_pk(wanted, 0), rate_key_hash=_by_pk(wanted, 1))
    # Read back (MariaDB has no RETURNING): a row claimed since it was read was not written
    # and has its old hashes still, whatever its status is by now.
    now = rows.values_list("pk", "serial_key_hash", "rate_key_hash")
    return {pk for pk, serial, rate in now if (serial, rate) == wanted[pk]}


def _by_pk(wanted: dict[int, Hashes], index: int) -> Case:
    whens = [When(pk=pk, then=Value(hashes[index])) for pk, hashes in wanted.items()]
    return Case(*whens, default=Value(None), output_field=CharField())


def _write_running(using: str, pk: int, hashes: Hashes, result: RekeyResult) -> None:
    """Write one row's hashes whatever its unfinished status; a serial key another running
    row holds refuses it (the unique index)."""
    rows = DeferredWork.objects.using(using).filter(pk=pk, status__in=UNFINISHED)
    try:
        with transaction.atomic(using=using):
            written = rows.update(serial_key_hash=hashes[0], rate_key_hash=hashes[1])
    except IntegrityError:
        result.held.append(pk)
        return
    result.rekeyed += written  # 0: it finished meanwhile, and no longer needs a key


def describe_result(result: RekeyResult) -> Sequence[str]:
    """The lines ``manage.py workflows rekey`` prints: counts and ids, no patient data."""
    lines = []
    if result.failed:
        lines.append(
            f"{len(result.failed)} row(s) left as they were, their key function failed: "
            f"{_ids(result.failed)} (first: {result.first_error})"
        )
    if result.held:
        lines.append(
            f"{len(result.held)} processing row(s) not keyed, another running row of their serial "
            f"key holds it: {_ids(result.held)}; run rekey again once they have ended"
        )
    lines.append(f"rekeyed {result.rekeyed} of {result.examined} unfinished row(s) of {result.kind}")
    return lines


def _ids(pks: list[int], shown: int = 20) -> str:
    named = ", ".join(f"#{pk}" for pk in pks[:shown])
    return named + (f" and {len(pks) - shown} more" if len(pks) > shown else "")

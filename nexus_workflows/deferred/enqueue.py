"""``enqueue``: the one entry point that starts a workflow, deferred or fire-and-forget.

Everything is validated before anything is written, so a rejected call leaves no trace.
"""

# Long module: enqueue and enqueue_many, their checks and their dedupe-and-revive rounds.

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, connections, router, transaction
from django.dispatch import Signal
from django.utils import timezone
from django.views.decorators.debug import sensitive_variables

from nexus_workflows import json_values, signals, sql
from nexus_workflows.clock import due_after
from nexus_workflows.deferred.registry import Workflow, registry
from nexus_workflows.delays import parse_delay
from nexus_workflows.exceptions import (
    DedupeKeyUnsettled,
    EnqueueRejected,
    InvalidDedupeKey,
    InvalidEnqueueOption,
    InvalidTrigger,
)
from nexus_workflows.flow import ordering
from nexus_workflows.flow.keys import flow_key_hashes
from nexus_workflows.limits import DEDUPE_KEY_MAX_LENGTH
from nexus_workflows.redaction import raised_at

logger = logging.getLogger("nexus_workflows.enqueueing")  # the name it has always logged under

DEFERRED_OPTIONS = frozenset({"delay"})

# Rows per INSERT statement in enqueue_many: large enough to amortise the round trips,
# small enough to stay well under every backend's parameter limit.
_BULK_CHUNK = 500

# Rounds of insert-then-look when the row we collide with vanishes (purged) or changes
# status between our two statements; more than a couple means something is wrong.
_DEDUPE_ROUNDS = 5


# sensitive_variables: an error report (Django's, DEBUG off) of a failure in here or below
# shows no frame's variables, SQL parameters included: triggers and keys are patient data.
@sensitive_variables()
def enqueue(kind: str, trigger: Any, **options: Any) -> str | None:
    """Start workflow ``kind`` for ``trigger`` unless its dedupe key is already taken.

    Deferred workflows (registered with a ``retry_schedule``): returns the work's id as a
    string when the work is pending — newly created, already pending (its trigger is
    left unchanged) or revived from abandoned (attempt 0, due now, checkpoints kept) —
    and ``None`` when work with that key is processing or done (within ``RETENTION``).
    Option: ``delay`` (seconds or a ``timedelta``) to make new work due later.

    Fire-and-forget workflows (no ``retry_schedule``): returns the RQ job id
    ``<kind>__<dedupe key>`` (keys outside RQ's id alphabet are escaped), or ``None``
    while a job with that id exists — queued, scheduled, running, or finished or failed
    within ``RETENTION``. Options: ``queue``, ``job_timeout``, ``at_front``, ``delay``.
    Inside ``transaction.atomic()`` the job is sent at commit; see
    :mod:`nexus_workflows.fire_and_forget` for what is returned then. Raises
    :class:`~nexus_workflows.exceptions.QueueUnavailable` when Redis cannot be reached.
    """
    workflow = registry.get(kind)
    dedupe_key = compute_dedupe_key(workflow, trigger)
    if workflow.is_deferred:
        using = _work_database()
        check_trigger(workflow, trigger, max_depth=sql.json_depth(using))
        delay = _deferred_options(workflow, options)
        flow_hashes = flow_key_hashes(workflow.kind, workflow.flow, trigger)
        # Its INSERT and its reads by key: a failed or cancelled one is logged without them.
        with sql.for_connection(using).values_sent_apart(using):
            return _enqueue_deferred(workflow, trigger, dedupe_key, delay, using, flow_hashes)

    from nexus_workflows.fire_and_forget import enqueue_job

    return enqueue_job(workflow, json_text(workflow, trigger), dedupe_key, options)


@sensitive_variables()  # as enqueue's
def enqueue_many(kind: str, triggers: Iterable[Any], **options: Any) -> list[str | None]:
    """Enqueue many triggers of one workflow; a deferred one's with one ``INSERT`` per 500.

    Returns one result per trigger, in order, with :func:`enqueue`'s meaning: the id of
    pending work (new, already pending, or revived from abandoned), or ``None`` when that
    key is processing or done. A key that appears twice gets the same result twice. Every
    trigger is validated before anything is written; one bad trigger rejects the batch.
    """
    workflow = registry.get(kind)
    if isinstance(triggers, str | bytes | dict) or not isinstance(triggers, Iterable):
        # A dict or a string is one trigger, not many: its keys or letters would be enqueued.
        raise InvalidTrigger(
            f"enqueue_many({workflow.kind!r}): triggers must be an iterable of triggers, such as "
            f"a list; got {type(triggers).__name__}"
        )
    if not workflow.is_deferred:
        from nexus_workflows.fire_and_forget import enqueue_job
        from nexus_workflows.fire_and_forget.sending import parse_options

        parse_options(workflow, options)  # even for no triggers: bad options are refused
        prepared = [(compute_dedupe_key(workflow, t), json_text(workflow, t)) for t in triggers]
        # One send per key, the first trigger winning as for deferred work: a repeat sent
        # again would get None (outside a transaction) or a second send at commit.
        results: dict[str, str | None] = {}
        for key, text in prepared:
            if key not in results:
                results[key] = enqueue_job(workflow, text, key, options)
        return [results[key] for key, _ in prepared]
    delay = _deferred_options(workflow, options)
    by_key: dict[str, str] = {}  # dedupe key -> the trigger's JSON text
    hashes: dict[str, tuple[str | None, str | None]] = {}  # dedupe key -> flow key hashes
    order: list[str] = []
    using = _work_database()
    max_depth = sql.json_depth(using)
    for trigger in triggers:
        key = compute_dedupe_key(workflow, trigger)
        text = json_text(workflow, trigger, max_depth=max_depth)
        if key not in by_key:  # the first trigger of a key wins, as with enqueue
            by_key[key] = text
            if workflow.flow is not None:
                hashes[key] = flow_key_hashes(workflow.kind, workflow.flow, trigger)
        order.append(key)
    with sql.for_connection(using).values_sent_apart(using):  # as enqueue's
        results = _enqueue_many_deferred(workflow, by_key, delay, hashes, using)
    return [results[key] for key in order]


def _enqueue_many_deferred(
    workflow: Workflow,
    by_key: dict[str, str],
    delay: timedelta,
    hashes: dict[str, tuple[str | None, str | None]],
    using: str,
) -> dict[str, str | None]:
    from nexus_workflows.deferred.wakeup import notify

    results: dict[str, str | None] = {}
    keys = list(by_key)
    # Announced once the batch's own atomic block is over: a later chunk's refusal rolls
    # back the rows of the earlier ones, which must not have been announced by then.
    announce: list[tuple[Signal, int]] = []
    try:
        with transaction.atomic(using=using):
            ordering.lock_keys(using, workflow.kind, (serial for serial, _ in hashes.values()))
            for start in range(0, len(keys), _BULK_CHUNK):
                chunk = keys[start : start + _BULK_CHUNK]
                for _ in range(_DEDUPE_ROUNDS):
                    chunk = _settle_chunk(workflow, by_key, hashes, chunk, delay, using, results, announce)
                    if not chunk:
                        break
                else:
                    # The kind and a count only: the keys may be patient data.
                    raise DedupeKeyUnsettled(
                        f"workflow {workflow.kind!r}: could not settle {len(chunk)} dedupe key(s) "
                        f"after {_DEDUPE_ROUNDS} rounds; rows kept changing under concurrent writers"
                    )
            notify(using, inserted=True)
    except (IntegrityError, DataError) as error:  # never the dedupe race: ON CONFLICT skips it
        raise _rejected(workflow, error, using) from None
    for signal, pk in announce:
        signals.send(signal, kind=workflow.kind, id=pk, attempt=1)
    return results


def _settle_chunk(
    workflow: Workflow,
    by_key: dict[str, str],
    hashes: dict[str, tuple[str | None, str | None]],
    chunk: list[str],
    delay: timedelta,
    using: str,
    results: dict[str, str | None],
    announce: list[tuple[Signal, int]],
) -> list[str]:
    """Insert the keys of ``chunk`` that are new and record every key's result; returns
    the keys to try again (their conflicting row was purged before it could be read).
    The signals to send once the batch is written are added to ``announce``."""
    # Long function: one batch's insert, dedupe and revive in one atomic.
    from nexus_workflows.deferred.inserts import insert_pending_many_postgresql
    from nexus_workflows.deferred.transitions import revive_ids
    from nexus_workflows.deferred.wakeup import notify
    from nexus_workflows.models import DeferredWork, Status

    now = timezone.now()  # the rows' creation stamp; their due time is the database's
    due = due_after(delay, now=now, using=using)
    # Existing keys are skipped by the database (ON CONFLICT DO NOTHING / INSERT OR
    # IGNORE), so concurrent writers cannot make this fail half-way.
    if connections[using].vendor == "postgresql":
        inserted = insert_pending_many_postgresql(
            using,
            kind=workflow.kind,
            keys=chunk,
            triggers=by_key,
            delay=delay,
            now=now,
            flow_hashes=hashes,
        )
        results.update((key, str(pk)) for key, pk in inserted.items())
        announce.extend((signals.work_enqueued, pk) for pk in inserted.values())
        chunk = [key for key in chunk if key not in inserted]
        if not chunk:
            return []
    else:
        DeferredWork.objects.using(using).bulk_create(
            [_new_row(workflow, key, by_key, hashes, due, now) for key in chunk], ignore_conflicts=True
        )
        if signals.has_receivers(signals.work_enqueued):
            # Rows inserted just now carry this call's exact creation time.
            announce.extend(
                (signals.work_enqueued, pk)
                for pk in DeferredWork.objects.using(using)
                .filter(kind=workflow.kind, dedupe_key__in=chunk, created_at=now)
                .values_list("pk", flat=True)
            )
    rows = list(
        DeferredWork.objects.using(using)
        .filter(kind=workflow.kind, dedupe_key__in=chunk)
        .values_list("dedupe_key", "pk", "status")
    )
    abandoned = [pk for _, pk, status in rows if status == Status.ABANDONED]
    revived: set[int] = set()
    if abandoned:
        candidates = DeferredWork.objects.using(using).filter(pk__in=abandoned)
        revived = revive_ids(candidates, due=due, by="enqueue")
        if revived:
            notify(using)
        announce.extend((signals.work_revived, pk) for pk in revived)
        if len(revived) < len(abandoned):
            # Changed since the read: revived by someone else (pending, or claimed by
            # now) or purged (then the key is new again: tried once more).
            changed = [pk for pk in abandoned if pk not in revived]
            now_status = dict(
                DeferredWork.objects.using(using).filter(pk__in=changed).values_list("pk", "status")
            )
            rows = [
                (key, pk, now_status[pk] if pk in changed else status)
                for key, pk, status in rows
                if pk not in changed or pk in now_status
            ]
    for key, pk, status in rows:
        pending = status == Status.PENDING or pk in revived
        results[key] = str(pk) if pending else None
    seen = {key for key, _, _ in rows}
    missing = [key for key in chunk if key not in seen]
    if missing and connections[using].vendor != "postgresql":
        # INSERT OR IGNORE skips a row any constraint refuses, not only a taken key: one
        # by one, a refusal by another constraint raises (and the batch is rolled back).
        return _insert_one_by_one(workflow, by_key, hashes, missing, due, now, using, results, announce)
    return missing


def _new_row(
    workflow: Workflow,
    key: str,
    by_key: dict[str, str],
    hashes: dict[str, tuple[str | None, str | None]],
    due: Any,
    now: Any,
) -> Any:
    """The unsaved pending row of ``key`` (the ORM path of ``enqueue_many``)."""
    from nexus_workflows.models import DeferredWork

    serial_key_hash, rate_key_hash = hashes.get(key, (None, None))
    return DeferredWork(
        kind=workflow.kind,
        dedupe_key=key,
        trigger=json.loads(by_key[key]),
        next_attempt_at=due,
        created_at=now,
        updated_at=now,
        serial_key_hash=serial_key_hash,
        rate_key_hash=rate_key_hash,
    )


def _insert_one_by_one(
    workflow: Workflow,
    by_key: dict[str, str],
    hashes: dict[str, tuple[str | None, str | None]],
    keys: list[str],
    due: Any,
    now: Any,
    using: str,
    results: dict[str, str | None],
    announce: list[tuple[Signal, int]],
) -> list[str]:
    """Insert each of ``keys`` on its own; returns those whose key was taken meanwhile (to
    settle again). Any other refusal raises ``IntegrityError``."""
    taken: list[str] = []
    for key in keys:
        work = _new_row(workflow, key, by_key, hashes, due, now)
        try:
            with transaction.atomic(using=using):
                work.save(using=using, force_insert=True)
        except IntegrityError as error:
            if not is_dedupe_conflict(error, connections[using]):
                raise
            taken.append(key)
            continue
        results[key] = str(work.pk)
        announce.append((signals.work_enqueued, work.pk))
    return taken


def compute_dedupe_key(workflow: Workflow, trigger: Any) -> str:
    """Run the workflow's ``dedupe_key`` and check what it returned.

    Messages name the kind and the rule but never the key or the trigger, which may
    carry patient data.
    """
    kind = workflow.kind
    try:
        key = workflow.dedupe_key(trigger)
    except Exception as error:  # noqa: BLE001 - whatever the user's function raises
        # Not chained: the error's message may quote the trigger (patient data).
        raise InvalidDedupeKey(
            f"workflow {kind!r}: dedupe_key raised {type(error).__name__} ({raised_at(error)}) "
            "for this trigger"
        ) from None
    if key is None:
        raise InvalidDedupeKey(
            f"workflow {kind!r}: dedupe_key returned None; it must return a non-empty string"
        )
    if not isinstance(key, str):
        raise InvalidDedupeKey(
            f"workflow {kind!r}: dedupe_key returned {type(key).__name__}; it must return a "
            "string (convert numbers with str())"
        )
    if not key.strip():
        raise InvalidDedupeKey(
            f"workflow {kind!r}: dedupe_key returned an empty or whitespace-only string; "
            "it must return a non-empty string"
        )
    if len(key) > DEDUPE_KEY_MAX_LENGTH:
        raise InvalidDedupeKey(
            f"workflow {kind!r}: dedupe_key returned {len(key)} characters; at most "
            f"{DEDUPE_KEY_MAX_LENGTH} are allowed"
        )
    problem = json_values.text_problem(key)
    if problem:
        raise InvalidDedupeKey(
            f"workflow {kind!r}: dedupe_key returned a string that {problem}; it must return "
            "valid Unicode text without NUL characters"
        )
    return key


def check_trigger(workflow: Workflow, trigger: Any, *, max_depth: int = json_values.MAX_DEPTH) -> None:
    """Refuse a trigger that would not come back equal and of the same types, or nests
    more than ``max_depth`` containers (a deferred trigger: ``sql.json_depth`` of the work's database).

    The one check of every enqueue path (deferred, many, fire-and-forget); the rules are
    in :mod:`nexus_workflows.json_values`. The message names the kind and the rule, never
    the trigger.
    """
    try:
        json_values.check(trigger, max_depth=max_depth)
    except json_values.Rejected as problem:
        raise InvalidTrigger(
            f"workflow {workflow.kind!r}: the trigger {problem}; {json_values.allowed(max_depth)}"
        ) from None


def _work_database() -> str:
    """The database deferred work is written to (the project's routers decide)."""
    from nexus_workflows.models import DeferredWork

    return router.db_for_write(DeferredWork)


def json_text(workflow: Workflow, trigger: Any, *, max_depth: int = json_values.MAX_DEPTH) -> str:
    """The trigger as JSON text, after checking that it can be stored."""
    check_trigger(workflow, trigger, max_depth=max_depth)
    return json_values.dumps(trigger)


def _deferred_options(workflow: Workflow, options: dict[str, Any]) -> timedelta:
    unknown = sorted(set(options) - DEFERRED_OPTIONS)
    if unknown:
        raise InvalidEnqueueOption(
            f"workflow {workflow.kind!r} is deferred; unknown option(s) {', '.join(unknown)}. "
            f"Allowed: {', '.join(sorted(DEFERRED_OPTIONS))}"
        )
    return parse_delay(workflow.kind, options.get("delay", 0))


def _enqueue_deferred(
    workflow: Workflow,
    trigger: Any,
    dedupe_key: str,
    delay: timedelta,
    using: str,
    flow_hashes: tuple[str | None, str | None] = (None, None),
) -> str | None:
    # Long function: the dedupe rounds of one enqueue in one loop.
    from nexus_workflows.deferred.inserts import insert_pending
    from nexus_workflows.deferred.wakeup import notify
    from nexus_workflows.models import DeferredWork, Status

    connection = connections[using]
    in_transaction = connection.in_atomic_block or not connection.get_autocommit()
    serial_key = flow_hashes[0]  # keys take ids in their enqueues' commit order (flow.ordering)
    for _ in range(_DEDUPE_ROUNDS):
        now = timezone.now()
        try:
            # Inside the caller's transaction a savepoint keeps a refusal (another
            # constraint, or on SQLite a lost dedupe race) from breaking it; in autocommit
            # mode the INSERT stands alone (one round trip), unless a serial key must be
            # locked first (see flow.ordering).
            with transaction.atomic(using=using) if in_transaction or serial_key else nullcontext():
                ordering.lock_keys(using, workflow.kind, [serial_key])
                # On PostgreSQL a taken key is skipped (None), never an error: the server
                # would log the violation's DETAIL, which quotes the key.
                work_id = insert_pending(
                    using,
                    kind=workflow.kind,
                    dedupe_key=dedupe_key,
                    trigger=trigger,
                    delay=delay,
                    now=now,
                    flow_hashes=flow_hashes,
                )
        except IntegrityError as error:  # SQLite and other backends: the dedupe race raises
            if not is_dedupe_conflict(error, connection):
                raise _rejected(workflow, error, using) from None
            work_id = None
        except DataError as error:
            raise _rejected(workflow, error, using) from None
        if work_id is not None:
            notify(using, inserted=True)
            logger.debug("%s #%s enqueued", workflow.kind, work_id)
            signals.send(signals.work_enqueued, kind=workflow.kind, id=work_id, attempt=1)
            return str(work_id)
        existing = (
            DeferredWork.objects.using(using)
            .filter(kind=workflow.kind, dedupe_key=dedupe_key)
            .values("pk", "status", "history", "updated_at")
            .first()
        )
        if existing is None:
            continue  # purged between the INSERT and this read: insert again
        if existing["status"] == Status.PENDING:
            return str(existing["pk"])
        if existing["status"] != Status.ABANDONED:
            logger.debug("%s #%s not enqueued: already %s", workflow.kind, existing["pk"], existing["status"])
            return None
        if _revive(existing, due_after(delay, now=now, using=using), using):
            notify(using)
            signals.send(signals.work_revived, kind=workflow.kind, id=existing["pk"], attempt=1)
            logger.info("%s #%s revived by enqueue: pending, attempt 0", workflow.kind, existing["pk"])
            return str(existing["pk"])
        # someone else changed it first: look again
    raise DedupeKeyUnsettled(
        f"workflow {workflow.kind!r}: could not settle the dedupe key after {_DEDUPE_ROUNDS} "
        "rounds; the row kept changing under concurrent writers"
    )


def is_dedupe_conflict(error: IntegrityError, connection: Any) -> bool:
    """Whether ``error`` is the dedupe constraint refusing a second row for a key.

    Only that is the dedupe race; any other constraint (NOT NULL, a CHECK or trigger added
    by the project) is a real refusal and must not be retried as if it were one. (On
    PostgreSQL ``enqueue`` never sees that race as an error: its INSERT skips a taken key.)
    """
    from nexus_workflows.models import DEDUPE_CONSTRAINT

    return sql.for_connection(connection.alias).violated_constraint(error) == DEDUPE_CONSTRAINT


def _rejected(workflow: Workflow, error: DatabaseError, using: str) -> EnqueueRejected:
    """The app's error for a database refusal: the constraint's name, never the row."""
    return EnqueueRejected(
        f"workflow {workflow.kind!r}: the database refused the new work ({sql.refused_by(error, using)}); "
        "nothing was written. Every documented input rule was met, so this is a constraint or "
        "trigger added to the table outside nexus_workflows"
    )


def _revive(existing: Mapping[str, Any], due: Any, using: str) -> bool:
    from nexus_workflows.deferred.history import append_entry
    from nexus_workflows.deferred.transitions import revive
    from nexus_workflows.models import DeferredWork

    # The updated_at match makes this a compare-and-set on the whole row, as the admin's
    # revive is: the history written is computed from exactly the row that was read.
    return (
        revive(
            DeferredWork.objects.using(using).filter(pk=existing["pk"], updated_at=existing["updated_at"]),
            due=due,
            history=append_entry(existing["history"], event="revived", by="enqueue"),
        )
        == 1
    )

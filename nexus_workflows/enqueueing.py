"""``enqueue``: the one entry point that starts a workflow, deferred or fire-and-forget.

Everything is validated before anything is written, so a rejected call leaves no trace.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.utils import timezone

from .exceptions import InvalidDedupeKey, InvalidEnqueueOption, InvalidTrigger
from .limits import DEDUPE_KEY_MAX_LENGTH
from .registry import Workflow, registry

logger = logging.getLogger(__name__)

DEFERRED_OPTIONS = frozenset({"delay"})

# Rows per INSERT statement in enqueue_many: large enough to amortise the round trips,
# small enough to stay well under every backend's parameter limit.
_BULK_CHUNK = 500

# Rounds of insert-then-look when the row we collide with vanishes (purged) or changes
# status between our two statements; more than a couple means something is wrong.
_DEDUPE_ROUNDS = 5


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
    stored_trigger = to_json(workflow, trigger)
    if workflow.is_deferred:
        delay = _deferred_options(workflow, options)
        return _enqueue_deferred(workflow, stored_trigger, dedupe_key, delay)

    from .fire_and_forget import enqueue_job

    return enqueue_job(workflow, stored_trigger, dedupe_key, options)


def enqueue_many(kind: str, triggers: Iterable[Any], **options: Any) -> list[str | None]:
    """Enqueue many triggers of one deferred workflow with a few statements per thousand.

    Returns one result per trigger, in order, with :func:`enqueue`'s meaning: the id of
    pending work (new, already pending, or revived from abandoned), or ``None`` when that
    key is processing or done. A key that appears twice gets the same result twice. Every
    trigger is validated before anything is written; one bad trigger rejects the batch.
    """
    workflow = registry.get(kind)
    if not workflow.is_deferred:
        from .fire_and_forget import enqueue_job

        prepared = [(compute_dedupe_key(workflow, t), to_json(workflow, t)) for t in triggers]
        return [enqueue_job(workflow, trigger, key, options) for key, trigger in prepared]
    delay = _deferred_options(workflow, options)
    by_key: dict[str, str] = {}  # dedupe key -> the trigger's JSON text
    order: list[str] = []
    for trigger in triggers:
        key = compute_dedupe_key(workflow, trigger)
        text = json_text(workflow, trigger)
        by_key.setdefault(key, text)  # the first trigger of a key wins, as with enqueue
        order.append(key)
    results = _enqueue_many_deferred(workflow, by_key, delay)
    return [results[key] for key in order]


def _enqueue_many_deferred(
    workflow: Workflow, by_key: dict[str, str], delay: timedelta
) -> dict[str, str | None]:
    from .models import DeferredWork
    from .wakeup import notify

    using = router.db_for_write(DeferredWork)
    results: dict[str, str | None] = {}
    keys = list(by_key)
    with transaction.atomic(using=using):
        for start in range(0, len(keys), _BULK_CHUNK):
            chunk = keys[start : start + _BULK_CHUNK]
            for _ in range(_DEDUPE_ROUNDS):
                chunk = _settle_chunk(workflow, by_key, chunk, delay, using, results)
                if not chunk:
                    break
            else:
                raise RuntimeError(
                    f"workflow {workflow.kind!r}: could not settle {len(chunk)} dedupe key(s) after "
                    f"{_DEDUPE_ROUNDS} rounds; rows kept changing under concurrent writers"
                )
        notify(using, inserted=True)
    return results


def _settle_chunk(
    workflow: Workflow,
    by_key: dict[str, str],
    chunk: list[str],
    delay: timedelta,
    using: str,
    results: dict[str, str | None],
) -> list[str]:
    """Insert the keys of ``chunk`` that are new and record every key's result; returns
    the keys to try again (their conflicting row was purged before it could be read)."""
    from .inserts import insert_pending_many_postgresql
    from .models import DeferredWork, Status
    from .wakeup import notify

    now = timezone.now()
    # Existing keys are skipped by the database (ON CONFLICT DO NOTHING / INSERT OR
    # IGNORE), so concurrent writers cannot make this fail half-way.
    if connections[using].vendor == "postgresql":
        inserted = insert_pending_many_postgresql(
            using, kind=workflow.kind, keys=chunk, triggers=by_key, due=now + delay, now=now
        )
        results.update((key, str(pk)) for key, pk in inserted.items())
        chunk = [key for key in chunk if key not in inserted]
        if not chunk:
            return []
    else:
        DeferredWork.objects.using(using).bulk_create(
            [
                DeferredWork(
                    kind=workflow.kind,
                    dedupe_key=key,
                    trigger=json.loads(by_key[key]),
                    next_attempt_at=now + delay,
                    created_at=now,
                    updated_at=now,
                )
                for key in chunk
            ],
            ignore_conflicts=True,
        )
    rows = list(
        DeferredWork.objects.using(using)
        .filter(kind=workflow.kind, dedupe_key__in=chunk)
        .values_list("dedupe_key", "pk", "status")
    )
    abandoned = [pk for _, pk, status in rows if status == Status.ABANDONED]
    revived: set[int] = set()
    if abandoned:
        revived = set(
            DeferredWork.objects.using(using)
            .filter(pk__in=abandoned, status=Status.ABANDONED)
            .values_list("pk", flat=True)
        )
        revive_rows(DeferredWork.objects.using(using).filter(pk__in=revived), due=now + delay)
        notify(using)
    for key, pk, status in rows:
        # Abandoned rows revived just now are pending; one that changed first is not ours.
        pending = status == Status.PENDING or pk in revived
        results[key] = str(pk) if pending else None
    seen = {key for key, _, _ in rows}
    return [key for key in chunk if key not in seen]


def compute_dedupe_key(workflow: Workflow, trigger: Any) -> str:
    """Run the workflow's ``dedupe_key`` and check what it returned.

    Messages name the kind and the rule but never the key or the trigger, which may
    carry patient data.
    """
    kind = workflow.kind
    try:
        key = workflow.dedupe_key(trigger)
    except Exception as error:
        raise InvalidDedupeKey(
            f"workflow {kind!r}: dedupe_key raised {type(error).__name__} for this trigger"
        ) from error
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
    if "\x00" in key:
        raise InvalidDedupeKey(
            f"workflow {kind!r}: dedupe_key returned a string containing a NUL character, "
            "which databases cannot store"
        )
    return key


def _reject_type(value: object) -> Any:
    raise InvalidTrigger(f"found a value of type {type(value).__name__}")


def to_json(workflow: Workflow, trigger: Any) -> Any:
    """The trigger as it will be stored and later handed to ``prepare``."""
    return json.loads(json_text(workflow, trigger))


def json_text(workflow: Workflow, trigger: Any) -> str:
    """The trigger as JSON text, after checking that it can be stored."""
    allowed = "dicts, lists, strings, finite numbers, booleans and None"
    try:
        text = json.dumps(trigger, allow_nan=False, default=_reject_type)
    except InvalidTrigger as error:
        raise InvalidTrigger(
            f"workflow {workflow.kind!r}: the trigger must be JSON-serialisable ({allowed}); {error}"
        ) from None
    except ValueError as error:
        reason = "a circular reference" if "ircular" in str(error) else "NaN or infinity"
        raise InvalidTrigger(
            f"workflow {workflow.kind!r}: the trigger must be JSON-serialisable ({allowed}); "
            f"it contains {reason}"
        ) from None
    except TypeError as error:  # e.g. dict keys that are tuples
        raise InvalidTrigger(
            f"workflow {workflow.kind!r}: the trigger must be JSON-serialisable ({allowed}) "
            "with string keys; "
            + ("found a key that is not a string" if "keys must be" in str(error) else "it is not")
        ) from None
    if "\\u0000" in text:
        raise InvalidTrigger(
            f"workflow {workflow.kind!r}: the trigger contains a NUL character, which "
            "PostgreSQL cannot store in JSON"
        )
    return text


def parse_delay(kind: str, value: Any) -> timedelta:
    if isinstance(value, timedelta):
        delay = value
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        delay = timedelta(seconds=value)
    else:
        raise InvalidEnqueueOption(
            f"workflow {kind!r}: delay must be a number of seconds or a timedelta; got {type(value).__name__}"
        )
    if delay < timedelta(0):
        raise InvalidEnqueueOption(f"workflow {kind!r}: delay must not be negative")
    return delay


def _deferred_options(workflow: Workflow, options: dict[str, Any]) -> timedelta:
    unknown = sorted(set(options) - DEFERRED_OPTIONS)
    if unknown:
        raise InvalidEnqueueOption(
            f"workflow {workflow.kind!r} is deferred; unknown option(s) {', '.join(unknown)}. "
            f"Allowed: {', '.join(sorted(DEFERRED_OPTIONS))}"
        )
    return parse_delay(workflow.kind, options.get("delay", 0))


def _enqueue_deferred(workflow: Workflow, trigger: Any, dedupe_key: str, delay: timedelta) -> str | None:
    from .inserts import insert_pending
    from .models import DeferredWork, Status
    from .wakeup import notify

    using = router.db_for_write(DeferredWork)
    connection = connections[using]
    in_transaction = connection.in_atomic_block or not connection.get_autocommit()
    for _ in range(_DEDUPE_ROUNDS):
        now = timezone.now()
        try:
            # Inside the caller's transaction a savepoint keeps a lost dedupe race from
            # breaking it; in autocommit mode the INSERT stands alone (one round trip).
            with transaction.atomic(using=using) if in_transaction else nullcontext():
                work_id = insert_pending(
                    using,
                    kind=workflow.kind,
                    dedupe_key=dedupe_key,
                    trigger=trigger,
                    due=now + delay,
                    now=now,
                )
            notify(using, inserted=True)
        except IntegrityError:
            existing = (
                DeferredWork.objects.using(using)
                .filter(kind=workflow.kind, dedupe_key=dedupe_key)
                .values("pk", "status", "history")
                .first()
            )
            if existing is None:
                continue  # purged between the INSERT and this read: insert again
            if existing["status"] == Status.PENDING:
                return str(existing["pk"])
            if existing["status"] != Status.ABANDONED:
                logger.debug(
                    "%s #%s not enqueued: already %s", workflow.kind, existing["pk"], existing["status"]
                )
                return None
            if _revive(existing, now + delay, using):
                notify(using)
                logger.info("%s #%s revived by enqueue: pending, attempt 0", workflow.kind, existing["pk"])
                return str(existing["pk"])
            continue  # someone else changed it first: look again
        else:
            logger.debug("%s #%s enqueued", workflow.kind, work_id)
            return str(work_id)
    raise RuntimeError(
        f"workflow {workflow.kind!r}: could not settle the dedupe key after {_DEDUPE_ROUNDS} "
        "rounds; the row kept changing under concurrent writers"
    )


def _revive(existing: dict[str, Any], due: Any, using: str) -> bool:
    from .history import append_entry
    from .models import DeferredWork

    return (
        revive_rows(
            DeferredWork.objects.using(using).filter(pk=existing["pk"]),
            due=due,
            history=append_entry(existing["history"], event="revived", by="enqueue"),
        )
        == 1
    )


def revive_rows(queryset: Any, *, due: Any = None, history: list[Any] | None = None) -> int:
    """Compare-and-set abandoned rows of ``queryset`` back to pending; returns rows revived.

    Rows that are not abandoned (a runner may be working on them) are left alone.
    """
    from .models import Status

    now = timezone.now()
    fields: dict[str, Any] = {
        "status": Status.PENDING,
        "attempt": 0,
        "next_attempt_at": due or now,
        "last_error": "",
        "claim_token": "",
        "claimed_at": None,
        "heartbeat_at": None,
        "finished_at": None,
        "updated_at": now,
    }
    if history is not None:
        fields["history"] = history
    return queryset.filter(status=Status.ABANDONED).update(**fields)

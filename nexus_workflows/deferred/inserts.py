"""Writing new pending rows: the hot paths of ``enqueue`` and ``enqueue_many``.

For a one-row INSERT the ORM's per-call work (a model instance, every field prepared, the
statement compiled anew) costs more than the database round trip itself, so the INSERT is
compiled once per database and only the values that change are prepared per call. On
PostgreSQL, many rows go in one statement that reads the keys and triggers from a single
JSON document: one parameter for the whole batch instead of a dozen per row.

Nothing changes in what is written: every column not given takes its model default, as
through the ORM. On PostgreSQL a taken dedupe key is skipped (``ON CONFLICT ON CONSTRAINT
… DO NOTHING``): no error on the server, whose log would show the failed statement with
the trigger in it. Elsewhere it raises ``IntegrityError``. A new row is due by the
database's clock (now plus the delay, in the statement itself), never by the host's; on
PostgreSQL it is stamped (``created_at``, ``updated_at``) by that clock too, and the
one-row INSERT returns the stamp with the id (a Django task's ``enqueued_at``). SQLite's
clock is this host's; on MariaDB, whose rows go through the ORM's ``create()`` (which
returns no value the database computed), the host's ``now`` stamps them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import connections
from django.db.models import Field

from nexus_workflows import sql
from nexus_workflows.clock import due_after
from nexus_workflows.models import DEDUPE_CONSTRAINT, DeferredWork

# The columns whose values differ between new rows, in the order the statements use. Every
# other column's model default is prepared once, so it must be a constant (or dict/list).
_VARYING = (
    "kind",
    "dedupe_key",
    "trigger",
    "next_attempt_at",
    "created_at",
    "updated_at",
    "serial_key_hash",
    "rate_key_hash",
    # Set by Django tasks (nexus_workflows.tasks); workflows take the model defaults.
    "priority",
    "queue_name",
    "backend_name",
)
_WORKFLOW_TASK_FIELDS = (0, "", "")
_NO_DELAY = timedelta(0)


@dataclass(frozen=True)
class _Plan:
    """What one database needs to insert new rows: built once, used for every enqueue."""

    columns: tuple[Field[Any, Any], ...]  # _VARYING, then every other column but the id
    defaults: tuple[Any, ...]  # the other columns' model defaults, prepared for the database
    # INSERT … RETURNING id (PostgreSQL: skipping a taken key); None where the backend
    # cannot return ids.
    one_row_sql: str | None
    one_row_defaults: tuple[Any, ...]  # bound after the varying values (PostgreSQL: literals)
    # The INSERT computes the due time (sql.postgresql.DUE_SQL) and the creation stamps
    # (NOW_SQL), and returns created_at after the id.
    due_by_database: bool
    returning_params: tuple[Any, ...]
    many_rows_sql: str | None  # PostgreSQL: INSERT … SELECT FROM jsonb_array_elements(…)


_plans: dict[tuple[str, str], _Plan] = {}


def _plan(using: str) -> _Plan:
    connection = connections[using]
    cache_key = (using, connection.vendor)
    if cache_key in _plans:
        return _plans[cache_key]
    opts = DeferredWork._meta
    varying = [cast("Field[Any, Any]", opts.get_field(name)) for name in _VARYING]  # each name is a column
    others = [f for f in opts.concrete_fields if not f.primary_key and f.name not in _VARYING]
    for field in others:
        if field.has_default() and callable(field.default) and field.default not in (dict, list):
            raise TypeError(f"DeferredWork.{field.name} has a callable default: add it to _VARYING")
    defaults = tuple(f.get_db_prep_save(f.get_default(), connection=connection) for f in others)
    statements = sql.for_connection(using)
    one_row_sql, one_row_defaults, returning_params = None, defaults, ()
    due_by_database = hasattr(statements, "insert_returning_pk_with_constants")
    if hasattr(statements, "insert_returning_pk_with_constants"):
        # The constants as literals: the INSERT binds only what varies.
        placeholders = ["%s"] * len(varying)
        placeholders[_VARYING.index("next_attempt_at")] = statements.DUE_SQL
        placeholders[_VARYING.index("created_at")] = statements.NOW_SQL
        placeholders[_VARYING.index("updated_at")] = statements.NOW_SQL
        constants = list(zip(others, defaults, strict=True))
        one_row_sql, returning_params = statements.insert_returning_pk_with_constants(
            DeferredWork,
            varying,
            constants,
            using,
            placeholders,
            skip_conflict_on=DEDUPE_CONSTRAINT,
            also_returning=[opts.get_field("created_at")],
        )
        one_row_defaults = ()
    elif hasattr(statements, "insert_returning_pk") and connection.features.can_return_columns_from_insert:
        # SQLite: its clock is this host's own, so the due time is bound like the rest.
        one_row_sql, returning_params = statements.insert_returning_pk(DeferredWork, varying + others, using)
    many_rows_sql = None
    if hasattr(statements, "insert_many_from_json_sql"):
        # A Django task's fields are constants there: enqueue_many is for workflows.
        many_rows_sql = statements.insert_many_from_json_sql(
            connection, opts.db_table, varying + others, opts.pk.column, DEDUPE_CONSTRAINT
        )
    plan = _Plan(
        columns=tuple(varying + others),
        defaults=defaults,
        one_row_sql=one_row_sql,
        one_row_defaults=one_row_defaults,
        due_by_database=due_by_database,
        returning_params=returning_params,
        many_rows_sql=many_rows_sql,
    )
    _plans[cache_key] = plan
    return plan


def insert_pending(
    using: str,
    *,
    kind: str,
    dedupe_key: str,
    trigger: Any,
    now: datetime,
    delay: timedelta = _NO_DELAY,
    run_after: datetime | None = None,
    flow_hashes: tuple[str | None, str | None] = (None, None),
    priority: int = 0,
    queue_name: str = "",
    backend_name: str = "",
) -> int | None:
    """Insert one pending row, due at ``run_after`` or else ``delay`` after the database's
    now; returns its id. A taken key returns ``None`` on PostgreSQL (no error on the
    server, so its log never gets the violation's DETAIL, which quotes the key) and raises
    ``IntegrityError`` elsewhere. See :func:`insert_pending_stamped` for ``now``."""
    inserted = insert_pending_stamped(
        using,
        kind=kind,
        dedupe_key=dedupe_key,
        trigger=trigger,
        now=now,
        delay=delay,
        run_after=run_after,
        flow_hashes=flow_hashes,
        priority=priority,
        queue_name=queue_name,
        backend_name=backend_name,
    )
    return None if inserted is None else inserted[0]


def insert_pending_stamped(
    using: str,
    *,
    kind: str,
    dedupe_key: str,
    trigger: Any,
    now: datetime,
    delay: timedelta = _NO_DELAY,
    run_after: datetime | None = None,
    flow_hashes: tuple[str | None, str | None] = (None, None),
    priority: int = 0,
    queue_name: str = "",
    backend_name: str = "",
) -> tuple[int, datetime] | None:
    """:func:`insert_pending`, returning ``(id, created_at)`` as stored: on PostgreSQL the
    database's time, returned by the INSERT itself (no round trip more); elsewhere ``now``
    (the host's: on SQLite that is the database's clock, see the module docstring)."""
    connection = connections[using]
    plan = _plan(using)
    if plan.one_row_sql is None:
        work = DeferredWork.objects.using(using).create(
            kind=kind,
            dedupe_key=dedupe_key,
            trigger=trigger,
            next_attempt_at=run_after or due_after(delay, now=now, using=using),
            created_at=now,
            updated_at=now,
            serial_key_hash=flow_hashes[0],
            rate_key_hash=flow_hashes[1],
            priority=priority,
            queue_name=queue_name,
            backend_name=backend_name,
        )
        return work.pk, now
    due = (run_after, delay)
    params = _one_row_params(
        plan, connection, kind, dedupe_key, trigger, due, now, flow_hashes, priority, queue_name, backend_name
    )
    with connection.cursor() as cursor:
        cursor.execute(plan.one_row_sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    return (row[0], row[1]) if plan.due_by_database else (row[0], now)


def one_row_statement(
    using: str,
    *,
    kind: str,
    dedupe_key: str,
    trigger: Any,
    now: datetime,
    delay: timedelta = _NO_DELAY,
) -> tuple[str, tuple[Any, ...]]:
    """The ``INSERT … RETURNING id`` that ``enqueue`` sends through :func:`insert_pending`
    for a workflow's row, with its parameters
    adapted for ``using``. The benchmarks run it on bare psycopg, to tell the statement's
    own cost from the layers above it."""
    plan = _plan(using)
    if plan.one_row_sql is None:
        raise NotImplementedError(f"database {using!r} cannot return ids from an INSERT")
    due = (None, delay)
    params = _one_row_params(
        plan, connections[using], kind, dedupe_key, trigger, due, now, (None, None), *_WORKFLOW_TASK_FIELDS
    )
    return plan.one_row_sql, params


def _one_row_params(
    plan: _Plan,
    connection: Any,
    kind: str,
    dedupe_key: str,
    trigger: Any,
    due: tuple[datetime | None, timedelta],
    now: datetime,
    flow_hashes: tuple[str | None, str | None],
    priority: int,
    queue_name: str,
    backend_name: str,
) -> tuple[Any, ...]:
    """The parameters of ``plan.one_row_sql``, in its order (:data:`_VARYING`, then the
    defaults it binds, then what its ``RETURNING`` binds); ``due`` is (``run_after``,
    ``delay``)."""
    stamp = plan.columns[4]
    run_after, delay = due
    if plan.due_by_database:  # sql.postgresql.DUE_SQL: the time given, else now + seconds
        given = None if run_after is None else stamp.get_db_prep_save(run_after, connection=connection)
        prepared_due: tuple[Any, ...] = (given, delay.total_seconds())
        stamps: tuple[Any, ...] = ()  # sql.postgresql.NOW_SQL
    else:  # SQLite: its clock is this host's (clock.due_after)
        when = run_after or due_after(delay, now=now, using=connection.alias)
        prepared_due = (stamp.get_db_prep_save(when, connection=connection),)
        prepared_now = stamp.get_db_prep_save(now, connection=connection)
        stamps = (prepared_now, prepared_now)
    return (
        kind,
        dedupe_key,
        plan.columns[2].get_db_prep_save(trigger, connection=connection),
        *prepared_due,
        *stamps,
        *flow_hashes,
        priority,
        queue_name,
        backend_name,
        *plan.one_row_defaults,
        *plan.returning_params,
    )


def insert_pending_many_postgresql(
    using: str,
    *,
    kind: str,
    keys: list[str],
    triggers: dict[str, str],
    delay: timedelta,
    now: datetime,
    flow_hashes: dict[str, tuple[str | None, str | None]] | None = None,
) -> dict[str, int]:
    """Insert pending rows for ``keys`` with one statement, skipping keys that exist, due
    ``delay`` after the database's now; ``triggers`` maps each key to its trigger's JSON
    text, ``flow_hashes`` (when the kind has keyed limits) to its (serial, rate) key
    hashes. Returns the ids inserted. The rows are stamped by the database's clock
    (``sql.postgresql.NOW_SQL``): ``now`` is not used."""
    connection = connections[using]
    plan = _plan(using)
    assert plan.many_rows_sql is not None, "PostgreSQL only"
    # The document is put together as text: each trigger is JSON text already.
    hashes = flow_hashes or {}
    document = (
        "["
        + ",".join(
            f"[{json.dumps(key)},{triggers[key]},{json.dumps(hashes.get(key, (None, None)))[1:-1]}]"
            for key in keys
        )
        + "]"
    )
    seconds = delay.total_seconds()  # sql.postgresql.DUE_AFTER_SQL; the stamps are NOW_SQL
    params = [kind, seconds, *_WORKFLOW_TASK_FIELDS, *plan.defaults]
    params.append(document)
    with connection.cursor() as cursor:
        cursor.execute(plan.many_rows_sql, params)
        return dict(cursor.fetchall())

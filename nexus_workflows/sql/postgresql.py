"""PostgreSQL's statements beyond the portable ORM, each named and each run by
``tests/test_sql.py``.

Internals used, and why: none beyond :mod:`.returning` (``UPDATE … RETURNING`` and the
precompiled ``INSERT``): the statements here are plain SQL on a Django cursor, or, for
``LISTEN``, on a psycopg connection of its own (Django's connections are shared by a
thread and pooled; a ``LISTEN`` needs a session that stays).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from django.apps import apps
from django.db import IntegrityError, connections, transaction
from django.db.models import BooleanField, Expression, F, Func, IntegerField, QuerySet

from nexus_workflows.sql.returning import can_return_from_update, insert_returning_pk, update_returning

if TYPE_CHECKING:
    from django.db.backends.postgresql.operations import DatabaseOperations

# Long module: every PostgreSQL statement of the app in one named place (claims, wake-ups,
# tokens, counts, the admin's estimates, migrations' index checks).

__all__ = [
    "ENDING_LOCK_CLASS",
    "EPOCH_OF_MINUTE",
    "REST_LOCK_CLASS",
    "WAITING_LOCK",
    "add_outcome_counts",
    "allocate_token_sql",
    "can_return_from_update",
    "claimable",
    "constraint_name",
    "distinct_kinds",
    "due_ids",
    "due_in_order",
    "estimated_rows",
    "hold_rest_lock",
    "hold_waiting_lock",
    "index_validity",
    "insert_many_from_json_sql",
    "insert_returning_pk",
    "insert_returning_pk_with_constants",
    "listen",
    "lock_wait_limit",
    "lock_waits_at_most",
    "notify",
    "pending_kinds",
    "read_only_snapshot",
    "release_rest_lock",
    "release_waiting_lock",
    "save_journals",
    "set_local_lock_timeout",
    "statement_timeout",
    "update_returning",
    "values_sent_apart",
    "violated_constraint",
]

#: Rows inserted by ``insert_many_from_json_sql``'s one parameter: a JSON array of
#: ``[dedupe key, trigger, serial key hash, rate key hash]`` items.
MANY_ROWS_ITEM = ("dedupe_key", "trigger", "serial_key_hash", "rate_key_hash")


def constraint_name(error: Exception) -> str | None:
    """The name of the constraint a refusal reports (psycopg's diagnostics), or None."""
    diag = getattr(error.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def violated_constraint(error: IntegrityError) -> str | None:
    """The name of the constraint an ``IntegrityError`` reports."""
    return constraint_name(error)


# Up to this many ids a claim names each in a placeholder of its own: the wake-up's claim
# by id is compiled once with a slot per id (claims._PRECOMPILED_IDS), and psycopg parses
# so short a statement once. Beyond, one array parameter (see SkipLocked).
PLACEHOLDER_IDS = 8


class _RowsOfIds(Expression):
    """A condition on a model's primary key and a list of ids (the subclass's ``as_sql``)."""

    output_field = BooleanField()

    def __init__(self, model: Any, ids: Sequence[Any]) -> None:
        super().__init__()
        self.model = model
        self.ids = list(ids)
        self.column: Any = F("pk")

    def get_source_expressions(self) -> list[Any]:
        return [self.column]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.column,) = exprs

    def ids_array(self, connection: Any) -> str:
        """The placeholder of the ids bound as one array of the primary key's type."""
        return f"%s::{self.model._meta.pk.cast_db_type(connection)}[]"


class SkipLocked(_RowsOfIds):
    """``pk = ANY(ARRAY(SELECT pk FROM … WHERE pk = ANY(ids) FOR NO KEY UPDATE SKIP LOCKED))``:
    the rows ``ids`` no other transaction holds a lock on, locked by this statement with
    the lock its ``UPDATE`` takes anyway (so it skips no lock a plain ``UPDATE`` would not
    wait for). ``ARRAY(…)`` is computed once, before the scan: the ``UPDATE`` then finds
    its rows by primary key, as without the lock (an ``IN (SELECT …)`` joins, and cost the
    statement twice as much more). Written as text: the ORM's subquery cost the claim 0.2 to
    0.3 ms more to build and compile than its statement's lock costs the database. The ids
    are one array parameter, not a placeholder each (beyond ``PLACEHOLDER_IDS``): the
    statement's text is then the same for every claim, and psycopg parses it once (it
    parsed a statement of over 50 placeholders at every claim, about 15 Python calls per id).
    The plan is the same: PostgreSQL reads ``IN (…)`` as ``= ANY(…)``."""

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        column, params = compiler.compile(self.column)
        quote = connection.ops.quote_name
        pk, table = quote(self.model._meta.pk.column), quote(self.model._meta.db_table)
        if len(self.ids) <= PLACEHOLDER_IDS:
            chosen, ids = f"IN ({', '.join(['%s'] * len(self.ids))})", tuple(self.ids)
        else:
            chosen, ids = f"= ANY({self.ids_array(connection)})", (self.ids,)
        locked = (
            f"SELECT nw_locked.{pk} FROM {table} AS nw_locked WHERE nw_locked.{pk} {chosen} "
            "FOR NO KEY UPDATE SKIP LOCKED"
        )
        return f"{column} = ANY(ARRAY({locked}))", (*params, *ids)


class OfIds(_RowsOfIds):
    """``pk = ANY(%s::bigint[])``: the rows ``ids``, bound as one array (see SkipLocked)."""

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        column, params = compiler.compile(self.column)
        return f"{column} = ANY({self.ids_array(connection)})", (*params, self.ids)


def of_ids(queryset: QuerySet[Any], ids: Sequence[Any]) -> QuerySet[Any]:
    """The rows ``ids`` of ``queryset``, the ids one array parameter beyond a few (the
    done-write of a claim's rows: the same statement text for any number, parsed once)."""
    if len(ids) <= PLACEHOLDER_IDS:
        return queryset.filter(pk__in=ids)
    return queryset.filter(OfIds(queryset.model, ids))


def claimable(candidates: QuerySet[Any], ids: Sequence[Any]) -> QuerySet[Any]:
    """The rows ``ids`` of ``candidates`` a claim's ``UPDATE`` may take: those no other
    session holds a row lock on (a request's transaction that changed the row and has not
    committed, a project's ``select_for_update()``). In the ``UPDATE``'s own statement, so
    no round trip more. The subquery locks the rows by id alone; the ``UPDATE`` checks
    ``candidates``' conditions on the rows it locked, and leaves one that no longer meets
    them as it is (locked for the statement's few milliseconds). Skipped rows stay for a
    later claim."""
    if not ids:
        return candidates.none()
    return candidates.filter(SkipLocked(candidates.model, ids))


# One kind's (or task queue's) due rows in the claim's order: a read of nw_due_kind_idx
# (nw_due_queue_idx) that stops at its LIMIT. The status is a literal, so the planner
# matches the partial indexes' condition whatever the parameters; the order is the
# indexes' expression (the priority negated, as Django writes -F("priority")), which
# nw_due_idx cannot give, so it is never read filtered by kind instead.
_DUE_OF_ONE = (
    "SELECT w.id, w.queue_name, (w.priority * -1) AS urgency, w.next_attempt_at FROM {table} AS w "
    "WHERE w.status = 'pending' AND {match} AND w.next_attempt_at <= {due} "
    "ORDER BY (w.priority * -1), w.next_attempt_at LIMIT %s"
)
# Every queue with pending tasks, one probe of nw_due_queue_idx per queue (a loose index scan).
_PENDING_QUEUES = (
    "WITH RECURSIVE nw_queues(name) AS ("
    " (SELECT queue_name FROM {table} WHERE status = 'pending' AND queue_name <> ''"
    " ORDER BY queue_name LIMIT 1)"
    " UNION ALL SELECT (SELECT t.queue_name FROM {table} AS t WHERE t.status = 'pending'"
    " AND t.queue_name <> '' AND t.queue_name > nw_queues.name ORDER BY t.queue_name LIMIT 1)"
    " FROM nw_queues WHERE nw_queues.name IS NOT NULL) "
)


# The claim's order as nw_due_kind_idx keys it, for an ORM read of one kind's
# due rows (the flow claims): the status and the -1 are literals, not parameters, so a
# generic plan of a prepared statement (server-side binding) still matches the partial
# index's condition and its expression.
_PENDING = Func(F("status"), template="%(expressions)s = 'pending'", output_field=BooleanField())
_URGENCY = Func(F("priority"), template="(%(expressions)s * -1)", output_field=IntegerField())


def due_in_order(candidates: QuerySet[Any]) -> QuerySet[Any]:
    """``candidates`` (pending rows of one kind) in the claim's order: highest priority
    first, then the longest due, then the id; read through ``nw_due_kind_idx``, so the
    due rows of other kinds are not walked past (``-priority`` reads ``nw_due_idx``)."""
    return candidates.filter(_PENDING).order_by(_URGENCY.asc(), "next_attempt_at", "pk")


def due_ids(
    using: str, kinds: Sequence[str], queues: Sequence[str] | None, now: Any, limit: int
) -> list[tuple[int, str]]:
    """``(id, queue_name)`` of up to ``limit`` due pending rows of ``kinds`` and of the
    task ``queues`` (None: every queue), highest priority first, then the longest due: the
    claim's read. One ordered read per kind and per queue, each stopping at ``limit``,
    merged: due rows of other kinds and queues, however many, are never read (the
    ``nw_due_idx`` order filtered by kind walked past every one of them). ``now``: a time,
    or None for the database's (``STATEMENT_TIMESTAMP()``, as ``DatabaseNow``)."""
    model = apps.get_model("nexus_workflows", "DeferredWork")
    table = connections[using].ops.quote_name(model._meta.db_table)
    due = "STATEMENT_TIMESTAMP()" if now is None else "%s::timestamptz"
    bound = [] if now is None else [now]

    def each(source: str, match: str) -> str:
        one = _DUE_OF_ONE.format(table=table, match=match, due=due)
        return f"SELECT d.* FROM {source} CROSS JOIN LATERAL ({one}) AS d"

    parts, params, head = [], [], ""
    if kinds:
        parts.append(each("unnest(%s::text[]) AS k(kind)", "w.kind = k.kind"))
        params += [list(kinds), *bound, limit]
    if queues is None:
        head = _PENDING_QUEUES.format(table=table)
        parts.append(each("nw_queues AS q", "w.queue_name <> '' AND w.queue_name = q.name"))
        params += [*bound, limit]
    elif queues:
        parts.append(each("unnest(%s::text[]) AS q(name)", "w.queue_name <> '' AND w.queue_name = q.name"))
        params += [list(queues), *bound, limit]
    if not parts:
        return []
    merged = " UNION ALL ".join(parts)
    order = "ORDER BY m.urgency, m.next_attempt_at LIMIT %s"
    statement = f"{head}SELECT m.id, m.queue_name FROM ({merged}) AS m {order}"
    with connections[using].cursor() as cursor:
        cursor.execute(statement, [*params, limit])
        rows = cursor.fetchall()
    # A task row of a kind also named among ``kinds`` comes from both reads: once is enough.
    return list(dict.fromkeys((row[0], row[1]) for row in rows))


def notify(cursor: Any, channel: str, payload: str = "") -> None:
    """``NOTIFY channel, payload`` (as a function: the channel is a parameter)."""
    cursor.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def listen(connection: Any, channel: str) -> None:
    """``LISTEN channel`` on a psycopg connection of its own (autocommit)."""
    from psycopg import sql

    connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))


def idle_session_timeout(connection: Any) -> float | None:
    """Seconds after which the server ends this psycopg connection's session when it sits
    idle (``idle_session_timeout``, PostgreSQL 14+, set by an operator on the server, the
    database or the role); None when it never does."""
    row = connection.execute(
        "SELECT setting::float / 1000 FROM pg_settings WHERE name = 'idle_session_timeout'"
    ).fetchone()
    return row[0] if row is not None and row[0] > 0 else None


def statement_timeout(using: str) -> float:
    """Seconds after which the server cancels a statement of this Django connection's
    session (``statement_timeout``, from the server, the database, the role or the
    session); 0 when it never does."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM current_setting('statement_timeout')::interval)::float")
        return float(cursor.fetchone()[0])


def keep_alive(connection: Any) -> None:
    """A statement on an idle psycopg connection, so the server does not end its session."""
    connection.execute("SELECT 1")


#: The advisory lock every runner waiting for a ``NOTIFY`` holds, shared, on its ``LISTEN``
#: session; the work table's trigger sends its ``NOTIFY`` only when it cannot take the lock
#: itself (migration 0011 writes the same two keys). Two int4 keys: a key space apart from
#: the one-bigint keys of :mod:`nexus_workflows.flow.ordering`.
WAITING_LOCK = (0x6E77_6B66, 1)  # "nwkf"


def hold_waiting_lock(connection: Any, *, lock_timeout: float | None = None) -> None:
    """On the listener's psycopg connection (autocommit): say this runner waits for a
    ``NOTIFY``. Blocks until every transaction that inserted work without sending one has
    ended, so the runner's next claim sees that work; with ``lock_timeout``, at most that
    many seconds (``LockNotAvailable``).

    The bound is the transaction's own (``set_config(…, true)``): a session-level setting
    would outlive it, and behind a pooler in transaction mode (where a listener finds its
    wake-ups lost) the server session, and its settings, go on to other clients: the
    runner's own claims, or another application's queries. The advisory lock is the
    session's and outlives the transaction, as it should."""
    if lock_timeout is None:
        connection.execute("SELECT pg_advisory_lock_shared(%s, %s)", WAITING_LOCK)
        return
    with connection.transaction():
        connection.execute("SELECT set_config('lock_timeout', %s, true)", [f"{round(lock_timeout * 1000)}ms"])
        connection.execute("SELECT pg_advisory_lock_shared(%s, %s)", WAITING_LOCK)


#: The class of the advisory locks a busy runner holds, shared, on its ``LISTEN`` session
#: for each limited kind that rests (``flow.claiming``): keys (this, ``hashtext(kind)``).
#: The work table's trigger also sends its ``NOTIFY`` when it cannot take the lock of a
#: kind it inserted (migration 0017 writes the same class); a hash shared by two kinds
#: only costs a NOTIFY more.
REST_LOCK_CLASS = 0x6E77_6B67  # "nwkg"


#: The class of the advisory locks a runner holds the same way for each limited kind it
#: rests until an attempt of it ends (every slot held): keys (this, ``hashtext(kind)``).
#: The work table's row trigger sends a ``NOTIFY`` naming an ended row of such a kind when
#: it cannot take its lock (migration 0019 writes the same class).
ENDING_LOCK_CLASS = 0x6E77_6B68  # "nwkh"


def hold_rest_lock(
    connection: Any, kind: str, *, lock_timeout: float, lock_class: int = REST_LOCK_CLASS
) -> None:
    """On the listener's psycopg connection (autocommit): this runner rests ``kind``.
    Waits (at most ``lock_timeout`` s, then ``LockNotAvailable``) for every open
    transaction that inserted rows of the kind (``ENDING_LOCK_CLASS``: ended an attempt
    of it) without notifying; see :func:`hold_waiting_lock` for why the bound is the
    transaction's own."""
    with connection.transaction():
        connection.execute(
            "SELECT set_config('lock_timeout', %s, true)", [f"{max(1, round(lock_timeout * 1000))}ms"]
        )
        connection.execute("SELECT pg_advisory_lock_shared(%s, hashtext(%s))", [lock_class, kind])


def release_rest_lock(connection: Any, kind: str, lock_class: int = REST_LOCK_CLASS) -> None:
    """On the listener's connection: this runner asks ``kind`` each turn again."""
    connection.execute("SELECT pg_advisory_unlock_shared(%s, hashtext(%s))", [lock_class, kind])


def set_local_lock_timeout(cursor: Any, seconds: float) -> None:
    """Within the current transaction only: wait at most ``seconds`` for any lock."""
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{max(1, round(seconds * 1000))}ms"])


# The least of the session's lock_timeout and statement_timeout that is set (0 is none;
# LEAST passes over NULLs), in seconds.
_LOCK_WAIT_LIMIT = (
    "SELECT LEAST("
    "NULLIF(EXTRACT(EPOCH FROM current_setting('lock_timeout')::interval), 0), "
    "NULLIF(EXTRACT(EPOCH FROM current_setting('statement_timeout')::interval), 0))::float8"
)


def lock_wait_limit(using: str) -> float | None:
    """Seconds a statement of the session waits for a lock at most: the least of its
    ``lock_timeout`` and its ``statement_timeout`` that is set; None when neither is."""
    with connections[using].cursor() as cursor:
        cursor.execute(_LOCK_WAIT_LIMIT)
        seconds = cursor.fetchone()[0]
    return None if seconds is None else float(seconds)


#: The longest lock_timeout PostgreSQL takes, in seconds: an int of milliseconds (24.8
#: days). The settings allow PURGE_BATCH_SECONDS up to ten years; a longer bound than this
#: is refused by the server (DataError), and would bound nothing anyway.
LOCK_TIMEOUT_MAX = 2_147_483.647

# The least of the bound (seconds, the parameter), the session's own lock_timeout (kept
# when lower) and half its statement_timeout (so a lock wait ends as a conflict, 55P03,
# never as a cancel, 57014, which would halve a purge's batches); 0 counts as none. Whole
# milliseconds, at least 1 (0 would mean no limit). Returns the value set, in ms.
_BOUNDED_LOCK_TIMEOUT = (
    "SELECT ms, set_config('lock_timeout', ms::text, true) FROM (SELECT GREATEST(1, CEIL(1000 * "
    "LEAST(%s::float8, "
    "NULLIF(EXTRACT(EPOCH FROM current_setting('lock_timeout')::interval), 0)::float8, "
    "NULLIF(EXTRACT(EPOCH FROM current_setting('statement_timeout')::interval), 0)::float8 / 2"
    ")))::bigint AS ms) AS bound"
)


@contextlib.contextmanager
def lock_waits_at_most(using: str, seconds: float) -> Iterator[float | None]:
    """Statements in the block wait at most ``seconds`` (and :data:`LOCK_TIMEOUT_MAX`) for
    a lock (then raise ``OperationalError``, SQLSTATE 55P03), or less where the session's
    ``lock_timeout`` is lower or half its ``statement_timeout`` is: one transaction around
    the block, its ``lock_timeout`` set for that transaction only (``set_config(…, true)``, as ``SET
    LOCAL``). Yields the seconds in effect.

    Already in a transaction, the block runs in it as it is (yields None): a local setting
    would last to the end of the caller's transaction, past the block."""
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        yield None
        return
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            cursor.execute(_BOUNDED_LOCK_TIMEOUT, [min(seconds, LOCK_TIMEOUT_MAX)])
            milliseconds = cursor.fetchone()[0]
        yield milliseconds / 1000


@contextlib.contextmanager
def read_only_snapshot(using: str) -> Iterator[bool]:
    """The block's reads in one snapshot (a ``REPEATABLE READ, READ ONLY`` transaction): an
    admin list's counts and rows agree, whatever commits meanwhile. Yields True; already
    in a transaction, the block runs in it as it is and yields False (the isolation level
    is set by a transaction's first statement)."""
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit() or _in_raw_transaction(connection):
        yield False
        return
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield True


def _in_raw_transaction(connection: Any) -> bool:
    """A transaction begun on the session behind Django's back (a raw ``BEGIN``): Django
    could not open its own, and the reads are that transaction's already."""
    from psycopg import pq

    raw = connection.connection
    return raw is not None and raw.info.transaction_status != pq.TransactionStatus.IDLE


@contextlib.contextmanager
def values_sent_apart(using: str) -> Iterator[None]:
    """The block's statements on ``using`` go to the server with their values apart from
    their text (psycopg's server-side binding; Django binds client-side unless
    ``OPTIONS["server_side_binding"]``). A statement that fails (a lock or statement
    timeout, a deadlock, a trigger's refusal) is written to the server's log
    (``log_min_error_statement = error``, the default) as ``… = $1``, without its values
    (``log_parameter_max_length_on_error = 0``, the default): the writes of triggers,
    journals, errors and histories use it, so patient data stays out of that log. Nothing
    is prepared (named prepared statements are lost by PgBouncer in transaction mode).

    The block swaps the cursor class of the session it finds (opened first, and replaced
    first if ``CONN_HEALTH_CHECKS`` finds it dead, as Django's first cursor would): one
    that Django opens again inside the block, after an error closed it, binds
    client-side. The app's callers write once per block; a write sent again (an outage's
    retry) enters a new block. psycopg2 binds client-side only: nothing changes there."""
    connection = connections[using]
    # As Django's first cursor would (CONN_HEALTH_CHECKS): a session found dead is replaced
    # now, before the swap, not by the block's first statement after it.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    binding = getattr(raw, "cursor_factory", None)
    cursors = _cursor_classes()
    # psycopg2; or bound on the server already (the setting, an outer block): as it is.
    if cursors is None or not (isinstance(binding, type) and issubclass(binding, cursors[0])):
        yield
        return
    # A prepare_threshold set without server-side binding did nothing before (a client-side
    # cursor never prepares); it must not start preparing here, where a pooler may lose them.
    threshold = raw.prepare_threshold
    raw.cursor_factory, raw.prepare_threshold = cursors[1], None
    try:
        yield
    finally:
        raw.cursor_factory, raw.prepare_threshold = binding, threshold


@functools.cache
def _cursor_classes() -> tuple[type, type] | None:
    """psycopg 3's client-side binding cursor and Django's server-side binding one; None
    under psycopg2, which binds client-side only."""
    try:
        from psycopg import ClientCursor
    except ImportError:
        return None
    # Defined by Django's backend under psycopg 3 only, hence not in its stubs.
    from django.db.backends.postgresql.base import ServerBindingCursor  # type: ignore[attr-defined]

    return ClientCursor, ServerBindingCursor


def release_waiting_lock(connection: Any) -> None:
    """On the listener's connection: this runner no longer waits (it has a backlog)."""
    connection.execute("SELECT pg_advisory_unlock_shared(%s, %s)", WAITING_LOCK)


#: A new row's due time, by the database's clock: the absolute time given (a Django task's
#: ``run_after``), else now plus the delay in seconds. Two parameters: that time or NULL,
#: then the seconds.
DUE_SQL = "COALESCE(%s, statement_timestamp() + make_interval(secs => %s))"
#: The same for many rows, which are only ever due after a delay: one parameter.
DUE_AFTER_SQL = "statement_timestamp() + make_interval(secs => %s)"
#: A new row's creation stamp (``created_at``, ``updated_at``), by the database's clock: a
#: Django task's ``enqueued_at`` is its ``created_at``, returned by the INSERT itself.
NOW_SQL = "statement_timestamp()"


def insert_returning_pk_with_constants(
    model: type[Any],
    varying: Sequence[Any],
    constants: Sequence[tuple[Any, Any]],
    using: str,
    varying_sql: Sequence[str] | None = None,
    skip_conflict_on: str | None = None,
    also_returning: Sequence[Any] = (),
) -> tuple[str, tuple[Any, ...]]:
    """:func:`insert_returning_pk` of ``varying`` fields and ``constants`` (``(field,
    value prepared for the database)`` pairs, the same for every row), with the constants
    written into the statement as literals: only the varying values are bound per call
    (fewer parameters to adapt and send on the enqueue path). ``(sql, trailing params)``
    as :func:`insert_returning_pk` returns them.

    The literals are rendered once by psycopg's own quoting (``ops.compose_sql``); they
    are model defaults, never data a caller passed. ``varying_sql`` (one per ``varying``
    field, ``%s`` by default) may put an expression of parameters in a field's place.

    ``skip_conflict_on`` (a unique constraint's name) adds ``ON CONFLICT ON CONSTRAINT …
    DO NOTHING``: a row that constraint refuses is skipped and no id returned, with no
    error on the server (whose log would show the violation's DETAIL, quoting the key); any other
    constraint still raises ``IntegrityError``. ``also_returning``: fields returned after
    the id.
    """
    connection = connections[using]
    fields = [*varying, *(field for field, _ in constants)]
    sql, trailing = insert_returning_pk(model, fields, using, also_returning)
    head, values = sql.split(" VALUES (", 1)
    placeholders, tail = values.split(")", 1)
    if placeholders.split(", ") != ["%s"] * len(fields):
        raise ValueError("the compiled INSERT does not bind one plain placeholder per field")
    ops = cast("DatabaseOperations", connection.ops)  # this module runs on PostgreSQL only
    literals = ops.compose_sql(", ".join(["%s"] * len(constants)), [v for _, v in constants])
    literals = literals.replace("%", "%%")  # the statement is still run with parameters
    bound = ", ".join(varying_sql or ["%s"] * len(varying))
    conflict = ""
    if skip_conflict_on is not None:
        conflict = f" ON CONFLICT ON CONSTRAINT {connection.ops.quote_name(skip_conflict_on)} DO NOTHING"
    return f"{head} VALUES ({bound}, {literals}){conflict}{tail}", trailing


def insert_many_from_json_sql(
    connection: Any, table: str, columns: Sequence[Any], pk_column: str, skip_conflict_on: str
) -> str:
    """``INSERT … SELECT … FROM jsonb_array_elements(%s) ON CONFLICT ON CONSTRAINT
    <skip_conflict_on> DO NOTHING RETURNING dedupe_key, id``: many rows from one JSON
    parameter (one parameter for the batch instead of a dozen per row). Only that
    constraint's refusals are skipped: any other unique index still raises.

    ``columns`` are the fields in the statement's order: ``kind``, ``dedupe_key``,
    ``trigger``, the due time (:data:`DUE_AFTER_SQL`), two timestamps (:data:`NOW_SQL`), the two key hashes,
    then every other column. Each is a typed parameter (the same for every row) except
    those read from the item.
    """
    quote = connection.ops.quote_name

    def typed(field: Any) -> str:
        return f"CAST(%s AS {field.db_type(connection)})"

    select = [
        typed(columns[0]),
        "item ->> 0",
        "item -> 1",
        DUE_AFTER_SQL,
        NOW_SQL,
        NOW_SQL,
        "item ->> 2",
        "item ->> 3",
        *(typed(f) for f in columns[8:]),
    ]
    return (
        f"INSERT INTO {quote(table)} ({', '.join(quote(f.column) for f in columns)}) "
        f"SELECT {', '.join(select)} FROM jsonb_array_elements(CAST(%s AS jsonb)) AS item "
        f"ON CONFLICT ON CONSTRAINT {quote(skip_conflict_on)} DO NOTHING "
        f"RETURNING {quote('dedupe_key')}, {quote(pk_column)}"
    )


def allocate_token_sql(connection: Any, maps: Any, tokens: Any, names: Sequence[str]) -> str:
    """The PHI token allocation as ONE statement (a data-modifying CTE): the
    compare-and-set on the map's sequence, then the token's insert only if it matched.
    Returns the new token's id, or no row when the sequence had moved; a taken value
    raises ``IntegrityError`` and undoes the whole statement.

    Parameters: new sequence, now, map id, expected sequence, then the token's ``names``
    values, now, now.
    """
    quote = connection.ops.quote_name
    map_id, sequence = quote(maps.pk.column), quote(maps.get_field("sequence").column)
    updated_at = quote(maps.get_field("updated_at").column)
    columns = ["token_map", *names, "created_at", "updated_at"]
    return (
        f"WITH claimed AS (UPDATE {quote(maps.db_table)} "
        f"SET {sequence} = %s, {updated_at} = %s "
        f"WHERE {map_id} = %s AND {sequence} = %s "
        f"RETURNING {map_id}) "
        f"INSERT INTO {quote(tokens.db_table)} "
        f"({', '.join(quote(tokens.get_field(name).column) for name in columns)}) "
        f"SELECT claimed.{map_id}, {', '.join(['%s'] * (len(columns) - 1))} FROM claimed "
        f"RETURNING {quote(tokens.pk.column)}"
    )


def add_outcome_counts(using: str, token: str, items: Sequence[tuple[str, str, int]]) -> bool:
    """Add ``(kind, outcome, n)`` counts to the database clock's current minute, once per
    ``token``, in ONE statement: a data-modifying CTE writes the token's row (``ON
    CONFLICT DO NOTHING``) and the counts only if it did (``unnest`` of three arrays, ``ON
    CONFLICT DO UPDATE`` adds to the minute's rows). Returns whether they were added."""
    from nexus_workflows.observability.models import OutcomeCount, OutcomeFlush

    connection = connections[using]
    table = connection.ops.quote_name(OutcomeCount._meta.db_table)
    flushes = connection.ops.quote_name(OutcomeFlush._meta.db_table)
    statement = (
        f"WITH batch AS (INSERT INTO {flushes} (token, at) VALUES (%s, statement_timestamp()) "
        "ON CONFLICT DO NOTHING RETURNING token) "
        f"INSERT INTO {table} (minute, kind, outcome, count) "
        "SELECT date_trunc('minute', statement_timestamp()), k, o, c "
        "FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS v(k, o, c) "
        f"WHERE EXISTS (SELECT 1 FROM batch) {_ADD_TO_MINUTE.format(table=table)}"
    )
    kinds, outcomes, numbers = zip(*items, strict=True)
    with transaction.mark_for_rollback_on_error(using), connection.cursor() as cursor:
        cursor.execute(statement, [token, list(kinds), list(outcomes), list(numbers)])
        return cursor.rowcount > 0


_ADD_TO_MINUTE = "ON CONFLICT (minute, kind, outcome) DO UPDATE SET count = {table}.count + excluded.count"

#: A minute column as seconds since the epoch (the dashboard's 5-minute buckets).
EPOCH_OF_MINUTE = "EXTRACT(EPOCH FROM minute)::bigint"


# Every save of a batch in one statement, its rows passed as three arrays, so the text
# (and plan) is the same whatever the batch's size. The fence is each save's (id, claim
# token) and the status; STATEMENT_TIMESTAMP() is what DatabaseNow compiles to here. Rows
# another session holds a lock on are skipped (as SkipLocked does), not waited for: one
# such row held every other save of the batch back (about 10% more per statement, measured).
_SAVE_JOURNALS = """
UPDATE {table} AS w
SET checkpoints = v.checkpoints::jsonb,
    heartbeat_at = STATEMENT_TIMESTAMP(),
    updated_at = STATEMENT_TIMESTAMP(),
    started_at = COALESCE(w.started_at, STATEMENT_TIMESTAMP())
FROM unnest(%s::bigint[], %s::text[], %s::text[]) AS v(id, token, checkpoints)
WHERE w.id = v.id AND w.claim_token = v.token AND w.status = %s
  AND w.id = ANY(ARRAY(
    SELECT l.id FROM {table} AS l WHERE l.id = ANY(%s::bigint[]) FOR NO KEY UPDATE SKIP LOCKED
  ))
RETURNING w.id
"""


def save_journals(using: str, ids: Sequence[int], tokens: Sequence[str], journals: Sequence[Any]) -> set[int]:
    """The journal writer's batch of fenced saves, skipping rows another session holds a
    lock on (see ``transitions.save_journals``); the ids written."""
    model = apps.get_model("nexus_workflows", "DeferredWork")
    with connections[using].cursor() as cursor:  # autocommit: one statement, one transaction
        cursor.execute(
            _SAVE_JOURNALS.format(table=model._meta.db_table),
            [list(ids), list(tokens), [json.dumps(journal) for journal in journals], "processing", list(ids)],
        )
        return {row[0] for row in cursor.fetchall()}


def index_validity(cursor: Any, table: str, name: str) -> bool | None:
    """Whether the index ``name`` on ``table`` is valid; None when there is none. An
    interrupted ``CREATE INDEX CONCURRENTLY`` leaves an invalid one behind: it is written
    to by every insert but never read."""
    cursor.execute(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = %s AND i.indrelid = to_regclass(%s)",
        [name, table],
    )
    row = cursor.fetchone()
    return None if row is None else bool(row[0])


def estimated_rows(using: str, sql: str, params: Sequence[Any], *, filtered: bool) -> int | None:
    """The planner's estimate of the rows ``sql`` returns (``EXPLAIN``, from the table's
    statistics: no row is read). Per-column statistics make it close for equality on a
    status or a kind, filtered or not."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return int(plan[0]["Plan"]["Plan Rows"])


def distinct_kinds(using: str) -> list[str]:
    """Every kind stored in the work table, one probe of the dedupe constraint's index
    (kind, dedupe_key) per kind (a loose index scan, which PostgreSQL does not plan by
    itself: ``SELECT DISTINCT kind`` read all 300,000 rows, 60-120 ms)."""
    return _kinds_one_probe_each(using, "")


def pending_kinds(using: str) -> list[str]:
    """Every kind with pending rows, one probe of ``nw_due_kind_idx`` (pending rows, kind
    first) per kind: what the admin's unknown-kinds notice starts from, instead of reading
    every due row (206 ms for 106,000 due rows of 300,000, under load)."""
    return _kinds_one_probe_each(using, "status = 'pending' AND ")


def _kinds_one_probe_each(using: str, condition: str) -> list[str]:
    """A loose index scan of the work table's kinds (rows matching ``condition``, a literal
    prefix of the WHERE clause): the first kind, then the next one after it, and so on."""
    table = apps.get_model("nexus_workflows", "DeferredWork")._meta.db_table
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE kinds(kind) AS ("
            f" (SELECT kind FROM {table} WHERE {condition}TRUE ORDER BY kind LIMIT 1)"
            f" UNION ALL SELECT (SELECT t.kind FROM {table} t WHERE {condition.replace('status', 't.status')}"
            f"t.kind > kinds.kind ORDER BY t.kind LIMIT 1)"
            f" FROM kinds WHERE kinds.kind IS NOT NULL"
            f") SELECT kind FROM kinds WHERE kind IS NOT NULL"
        )
        return [kind for (kind,) in cursor.fetchall()]

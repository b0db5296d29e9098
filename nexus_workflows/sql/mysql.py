"""MySQL's and MariaDB's statements beyond the portable ORM, each run by ``tests/test_sql.py``
(on MariaDB 10.11: ``bin/test``'s MariaDB leg; MySQL itself is not tested).

What MariaDB lacks, and what the app does instead: ``UPDATE … RETURNING`` (claims and
done-writes read their rows back by claim token, as on every backend without it),
``NOTIFY`` (runners poll), data-modifying CTEs and ``ON CONFLICT``, and partial indexes
(concurrency caps and serial keys are refused by the system check
``nexus_workflows.E009``). ``INSERT … RETURNING`` it has (10.5+): Django's ``create()``
uses it by itself.

What this module adds over :mod:`.portable`:

- the outcome counts' upsert in two statements (``INSERT IGNORE`` of the batch's token,
  then one ``INSERT … ON DUPLICATE KEY UPDATE`` of every count), in the database's minute;
- a minute as epoch seconds and the integer division of the dashboard's buckets, both
  independent of the session's time zone;
- which constraint refused a row, read from the server's message (its key's name only);
- MariaDB's nesting limit of JSON documents, which the app's own checks apply here;
- a block whose statements wait at most so long for a row lock (the runner's purge);
- a block whose reads see one snapshot (an admin list's counts and rows);
- the claim's read of due rows, one ordered read per kind and per task queue merged
  (``due_ids``), through two indexes of its own (``DUE_INDEXES``, migration 0018).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator, Sequence
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import QuerySet

from nexus_workflows.database_errors import mysql_error_number

# A limited kind's read is the ORM's, in the claim's order: with nw_mariadb_due_kind_idx
# (migration 0018) the optimizer reads the kind's entries in order (EXPLAIN: ref on it, no
# filesort), so other kinds' due rows are not walked past. Not forced: measured with 200,000
# due rows of another kind ahead (rate_limit=, with and without a rate key), or 200,000 of
# its own not yet due, it read 3 entries to take 3 (12 of 12 per rate key).
from nexus_workflows.sql.portable import due_in_order

# Long module: every MySQL/MariaDB statement of the app in one named place (counts, locks,
# refusals, the due indexes, estimates, snapshots).

__all__ = [
    "DDL_LOCK_WAIT",
    "DUE_INDEXES",
    "EPOCH_OF_MINUTE",
    "INTEGER_DIVIDE",
    "JSON_DEPTH_LIMIT",
    "add_due_indexes",
    "add_outcome_counts",
    "claimable",
    "constraint_name",
    "drop_due_indexes",
    "due_ids",
    "due_in_order",
    "estimated_rows",
    "lock_wait_limit",
    "lock_waits_at_most",
    "notify",
    "read_only_snapshot",
    "statement_timeout",
    "values_sent_apart",
    "violated_constraint",
]

#: Most containers MariaDB's ``JSON_VALID`` (the CHECK of every JSON column there) accepts
#: nested in one document: measured on 10.11.19, 31 pass and 32 are refused, whether
#: lists or objects. MySQL's own JSON type takes 100; it gets MariaDB's limit too (it is
#: not tested, and telling the two apart would cost a query). The app's own checks apply
#: it to JSON stored here (``sql.database_json_depth``).
JSON_DEPTH_LIMIT = 31

#: The server's error numbers whose message names a constraint: a duplicate key (the
#: unique index's name, after the row's values) and a CHECK constraint (MariaDB's 4025).
_DUPLICATE_KEY = 1062
_CHECK_FAILED = 4025
# Anchored at the end: the values quoted before the key's name may hold anything.
_KEY_NAME = re.compile(r" for key '(?:[^'.]+\.)?(?P<name>[^']+)'\Z")
_CHECK_NAME = re.compile(r"\ACONSTRAINT `(?P<name>[^`]+)` failed for ")


def _error_number_and_text(error: Exception) -> tuple[int, str] | None:
    number = mysql_error_number(error)
    text = error.args[1] if len(error.args) == 2 else None
    return (number, text) if number is not None and isinstance(text, str) else None


def constraint_name(error: Exception) -> str | None:
    """The name of the unique index or CHECK constraint a MySQL/MariaDB error (Django's,
    which keeps the driver's ``(number, message)``) reports, or None. Only the name is
    read: the message also quotes the refused row's values."""
    found = _error_number_and_text(error)
    if found is None:
        return None
    number, text = found
    pattern = {_DUPLICATE_KEY: _KEY_NAME, _CHECK_FAILED: _CHECK_NAME}.get(number)
    match = pattern.search(text) if pattern is not None else None
    return match["name"] if match else None


def violated_constraint(error: IntegrityError) -> str | None:
    """The name of the unique index a duplicate-key error reports, or None (any other
    refusal, a CHECK included, is never a dedupe race)."""
    found = _error_number_and_text(error)
    if found is None or found[0] != _DUPLICATE_KEY:
        return None
    return constraint_name(error)


def of_ids(queryset: QuerySet[Any], ids: Sequence[Any]) -> QuerySet[Any]:
    """The rows ``ids`` of ``queryset``."""
    return queryset.filter(pk__in=ids)


def claimable(candidates: QuerySet[Any], ids: Sequence[Any]) -> QuerySet[Any]:
    """The rows ``ids`` of ``candidates`` a claim's ``UPDATE`` may take: those no other
    session holds a row lock on, locked now (``SELECT … FOR UPDATE SKIP LOCKED``, MariaDB
    10.6+) for the claim's transaction, which must be open. One statement more: InnoDB's
    ``UPDATE … WHERE id IN (SELECT … SKIP LOCKED)`` locks every row of its own scan, and
    waits. On an older server the rows are as given, and the claim waits for a lock as it
    always did (``innodb_lock_wait_timeout``)."""
    chosen = candidates.filter(pk__in=ids)
    if not connections[candidates.db].features.has_select_for_update_skip_locked:
        return chosen
    locked = list(chosen.order_by().select_for_update(skip_locked=True).values_list("pk", flat=True))
    return candidates.filter(pk__in=locked) if locked else candidates.none()


def lock_wait_limit(using: str) -> float | None:
    """Seconds a statement of the session waits for a row lock at most: the least of its
    ``innodb_lock_wait_timeout`` (never "for ever") and MariaDB's ``max_statement_time``
    when that is set (0: none; MySQL has no such variable)."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
        limit = float(cursor.fetchone()[0])
        try:
            cursor.execute("SELECT @@SESSION.max_statement_time")
        except DatabaseError:  # MySQL: its max_execution_time bounds SELECTs only
            return limit
        statement = float(cursor.fetchone()[0] or 0)
    return min(limit, statement) if statement else limit


@contextlib.contextmanager
def lock_waits_at_most(using: str, seconds: float) -> Iterator[float | None]:
    """Statements in the block wait at most ``seconds`` for a row lock, in whole seconds
    (``innodb_lock_wait_timeout``, at least 1; a lower one of the session's stays), then
    raise ``OperationalError`` 1205, which :func:`nexus_workflows.database_errors.transaction_conflict`
    names. The session's value is set before the block and put back after it: the setting
    is not transactional here, and the block runs in autocommit. Yields the seconds in
    effect.

    Already in a transaction, the block runs in it as it is (yields None), as on PostgreSQL."""
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit():
        yield None
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
        before = int(cursor.fetchone()[0])
        in_effect = min(before, max(1, math.ceil(seconds)))
        if in_effect != before:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [in_effect])
    try:
        yield float(in_effect)
    finally:
        if in_effect != before:
            _put_back_lock_wait(using, before)


def _put_back_lock_wait(using: str, seconds: int) -> None:
    try:
        with connections[using].cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [seconds])
    except DatabaseError:
        # The session is in doubt (an outage): a new one starts with the server's value.
        connections[using].close()


def values_sent_apart(using: str) -> contextlib.AbstractContextManager[None]:
    """As it is: MySQL's driver binds client-side only, and the server logs no failed
    statement unless its general or slow query log is on (off by default)."""
    return contextlib.nullcontext()


def notify(cursor: object, channel: str, payload: str = "") -> None:
    """No ``NOTIFY`` here: runners find new work by polling."""


@contextlib.contextmanager
def read_only_snapshot(using: str) -> Iterator[bool]:
    """The block's reads in one snapshot (a ``REPEATABLE READ, READ ONLY`` transaction,
    InnoDB's consistent read from the first one on; Django's sessions are ``READ
    COMMITTED``, a snapshot per statement). Yields True; already in a transaction, the
    block runs in it as it is and yields False."""
    connection = connections[using]
    if connection.in_atomic_block or not connection.get_autocommit() or _in_raw_transaction(connection):
        yield False
        return
    with transaction.atomic(using=using):
        with connection.cursor() as cursor:  # for the transaction the next statement starts
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield True


def _in_raw_transaction(connection: Any) -> bool:
    """A transaction begun on the session behind Django's back (a raw ``BEGIN``): in it,
    ``SET TRANSACTION`` fails (1568), and leaving Django's block would end the caller's
    transaction. MariaDB says so (``@@in_transaction``); MySQL has no such variable."""
    if not connection.mysql_is_mariadb:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@in_transaction")
        return bool(cursor.fetchone()[0])


def statement_timeout(using: str) -> None:
    """Not known here (None), as on other databases: MariaDB's ``max_statement_time`` is
    not read, and a batch it cancels (error 1969) is not told from an outage."""
    return None


#: The database's minute (UTC, whatever the session's time zone) as a DATETIME literal.
_MINUTE = "DATE_FORMAT(UTC_TIMESTAMP(), '%%Y-%%m-%%d %%H:%%i:00')"


def add_outcome_counts(using: str, token: str, items: Sequence[tuple[str, str, int]]) -> bool:
    """Add ``(kind, outcome, n)`` counts to the database clock's current minute, once per
    ``token``: the token's row (``INSERT IGNORE``: a taken token inserts nothing) and, only
    if it was new, every count in one ``INSERT … ON DUPLICATE KEY UPDATE`` that adds to
    the minute's rows; one transaction. Returns whether they were added.

    ``INSERT IGNORE`` would turn any refusal of the token's row into a warning; its only
    values are a 32-character token and the server's clock, so the one it meets is the
    duplicate token."""
    from nexus_workflows.observability.models import OutcomeCount, OutcomeFlush

    connection = connections[using]
    table = connection.ops.quote_name(OutcomeCount._meta.db_table)
    flushes = connection.ops.quote_name(OutcomeFlush._meta.db_table)
    values = ", ".join(f"({_MINUTE}, %s, %s, %s)" for _ in items)
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute(f"INSERT IGNORE INTO {flushes} (token, at) VALUES (%s, UTC_TIMESTAMP(6))", [token])
        if cursor.rowcount != 1:
            return False
        cursor.execute(
            f"INSERT INTO {table} (minute, kind, outcome, count) VALUES {values} "
            "ON DUPLICATE KEY UPDATE count = count + VALUES(count)",
            [value for item in items for value in item],
        )
    return True


#: A minute column as seconds since the epoch (the dashboard's 5-minute buckets), read as
#: the UTC time it is stored as: ``UNIX_TIMESTAMP`` would read it in the session's zone.
EPOCH_OF_MINUTE = "TIMESTAMPDIFF(SECOND, '1970-01-01 00:00:00', minute)"
#: Integer division (``/`` gives a decimal here, so minutes of one bucket would not group).
INTEGER_DIVIDE = "DIV"


def estimated_rows(using: str, sql: str, params: Sequence[Any], *, filtered: bool) -> int | None:
    """The optimizer's estimate of the rows a one-table ``sql`` reads (``EXPLAIN``: rows
    times filtered): close for the whole table (its statistics: 297,532 for 300,000 rows),
    not under a condition (an index range's estimate was 148,766 for 282,000 done rows):
    None then, count them."""
    if filtered:
        return None
    with connections[using].cursor() as cursor:
        cursor.execute(f"EXPLAIN EXTENDED {sql}", params)
        columns = [column[0] for column in cursor.description]
        row = dict(zip(columns, cursor.fetchone(), strict=True))
    return int(float(row["rows"] or 0) * float(row.get("filtered") or 100) / 100)


#: The due order per kind and per task queue, which PostgreSQL's partial expression indexes
#: nw_due_kind_idx and nw_due_queue_idx give and MariaDB cannot (no partial or expression
#: indexes; DESC is honoured from 10.8): the status leads, so pending rows are apart from
#: finished ones. Every row has an entry (a claim and its done-write move it). Outside the
#: models (migration 0018), so only MariaDB builds them.
DUE_INDEXES = {
    "nw_mariadb_due_kind_idx": "status, kind, priority DESC, next_attempt_at",
    "nw_mariadb_due_queue_idx": "status, queue_name, priority DESC, next_attempt_at",
}


#: Seconds an ALTER of the work table waits for its metadata lock (``WAIT``, MariaDB
#: 10.3+), which even an online one needs for a moment at its start and end: waiting, it
#: holds every later statement on the table behind it, and the server's own bound
#: (``lock_wait_timeout``) is a day. Past it the ALTER fails (1205), nothing built, and
#: the migration is run again (as PostgreSQL's 0015 and 0019).
DDL_LOCK_WAIT = 5


def add_due_indexes(schema_editor: Any, table: str) -> None:
    """Build :data:`DUE_INDEXES` on ``table`` in one online pass (writes go on); re-runnable."""
    quote = schema_editor.quote_name
    adds = ", ".join(f"ADD INDEX IF NOT EXISTS {quote(n)} ({c})" for n, c in DUE_INDEXES.items())
    schema_editor.execute(
        f"ALTER TABLE {quote(table)} WAIT {DDL_LOCK_WAIT} {adds}, ALGORITHM=INPLACE, LOCK=NONE"
    )


def drop_due_indexes(schema_editor: Any, table: str) -> None:
    """Drop :data:`DUE_INDEXES` from ``table`` (0018's reverse); those missing are skipped."""
    quote = schema_editor.quote_name
    drops = ", ".join(f"DROP INDEX IF EXISTS {quote(name)}" for name in DUE_INDEXES)
    schema_editor.execute(f"ALTER TABLE {quote(table)} WAIT {DDL_LOCK_WAIT} {drops}")


# One kind's (or task queue's) due rows in the claim's order, a read of its index that stops
# at the LIMIT (the InnoDB key ends with the id, so the id's order is the index's too). The
# index is forced: left to itself the optimizer read nw_due_idx for one kind of two and
# walked past 208,100 rows (ANALYZE FORMAT=JSON, 200,000 rows of other kinds ahead).
_DUE_OF_ONE = (
    "(SELECT id, queue_name, priority, next_attempt_at FROM {table} FORCE INDEX ({index}) "
    "WHERE status = 'pending' AND {column} = %s AND next_attempt_at <= {due} "
    "ORDER BY priority DESC, next_attempt_at, id LIMIT %s)"
)
# The next queue with pending tasks after a name: one probe of nw_mariadb_due_queue_idx
# (EXPLAIN: "Select tables optimized away"). MariaDB 10.11 plans no loose index scan of that
# index (GROUP BY and DISTINCT read all 200,000 entries; nw_serial_idx, without a DESC key
# part, gets one) nor a recursive CTE of these probes (each read the status's entries from
# the start), so the probes after several names go in one statement, a UNION ALL. The index
# is forced: before migration 0018 a probe would scan the table; it fails at once (1176).
_NEXT_QUEUE = (
    "(SELECT MIN(queue_name) FROM {table} FORCE INDEX ({index}) WHERE status = 'pending' AND queue_name > %s)"
)
#: "Key ... doesn't exist" (a forced index not built: migration 0018 not applied yet).
_NO_SUCH_KEY = 1176

#: The queues last found with pending tasks, per database: the next search probes after each
#: of them. A hint only (the search is right whatever it holds), shared by a runner's threads.
_KNOWN_QUEUES: dict[str, tuple[str, ...]] = {}


def _pending_queues(cursor: Any, table: str, using: str) -> list[str]:
    """Every queue with pending tasks: the next one after '' and after each known queue, in
    one statement, again with those found added while one is new. Done when none is: a
    pending queue not found would have been the next after the probed name below it,
    unless another pending queue lay between them, which is then a new one. So one
    statement while the queues are those of the last search; one more per queue found
    between the same two names (a runner's first search: one per queue, as the old loop)."""
    _, queue_index = DUE_INDEXES
    probe = _NEXT_QUEUE.format(table=table, index=queue_index)
    probes = ("", *_KNOWN_QUEUES.get(using, ()))
    while True:
        cursor.execute(" UNION ALL ".join([probe] * len(probes)), probes)
        found = {name for (name,) in cursor.fetchall() if name is not None}
        if found <= set(probes):
            _KNOWN_QUEUES[using] = tuple(sorted(found))
            return sorted(found)
        probes = tuple(sorted({*probes, *found}))


def _merged_read(
    table: str, kinds: Sequence[str], queues: Sequence[str], due: str, bound: list[Any], limit: int
) -> tuple[str, list[Any]] | None:
    """The claim's read: one ordered read per kind and per queue, merged (None: nothing to read)."""
    parts: list[str] = []
    params: list[Any] = []
    kind_index, queue_index = DUE_INDEXES
    for column, index, values in (("kind", kind_index, kinds), ("queue_name", queue_index, queues)):
        for value in dict.fromkeys(value for value in values if value):
            parts.append(_DUE_OF_ONE.format(table=table, index=index, column=column, due=due))
            params += [value, *bound, limit]
    if not parts:
        return None
    merged = " UNION ALL ".join(parts)
    order = "ORDER BY m.priority DESC, m.next_attempt_at, m.id LIMIT %s"
    return f"SELECT m.id, m.queue_name FROM ({merged}) AS m {order}", [*params, limit]


def due_ids(
    using: str, kinds: Sequence[str], queues: Sequence[str] | None, now: Any, limit: int
) -> list[tuple[int, str]] | None:
    """``(id, queue_name)`` of up to ``limit`` due pending rows of ``kinds`` and of the task
    ``queues`` (None: every queue), highest priority first, then the longest due, then the
    id: the claim's read, as ``sql.postgresql.due_ids``. One ordered read per kind and per
    queue (:data:`DUE_INDEXES`), each stopping at ``limit``, merged under one ``LIMIT``: due
    rows of other kinds and queues are never read. ``now``: a time, or None for the
    database's (``UTC_TIMESTAMP(6)``, as ``DatabaseNow``: no session time zone). A runner of
    every queue first finds the queues with pending tasks (one statement more while they
    stay those of its last search: :func:`_pending_queues`). None (the
    ORM's read) while migration 0018 has not built the indexes."""
    from nexus_workflows.models import DeferredWork

    connection = connections[using]
    table = connection.ops.quote_name(DeferredWork._meta.db_table)
    due = "UTC_TIMESTAMP(6)" if now is None else "%s"
    bound = [] if now is None else [connection.ops.adapt_datetimefield_value(now)]
    with connection.cursor() as cursor:
        try:
            if queues is None:
                queues = _pending_queues(cursor, table, using)
            read = _merged_read(table, kinds, queues, due, bound, limit)
            if read is None:
                return []
            cursor.execute(*read)
        except DatabaseError as error:
            if mysql_error_number(error) == _NO_SUCH_KEY:
                return None
            raise
        rows = cursor.fetchall()
    # A task row of a kind also named among ``kinds`` comes from both reads: once is enough.
    return list(dict.fromkeys((row[0], row[1]) for row in rows))

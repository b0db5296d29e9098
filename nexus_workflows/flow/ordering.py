"""What "earlier-enqueued" means for a kind with a ``serial_key``: **its enqueue committed
first**.

The claim orders a key's items by id, and an id is given when the row is inserted, not
when its transaction commits: two enqueues of one key whose transactions overlap could
commit in the other order, and a runner could start the later id before the earlier one
is even visible. So enqueues of a keyed kind take a transaction-level lock of each key
they write before inserting, held until their transaction ends: the enqueues of one key
are serialised, and their ids follow their commit order.

* PostgreSQL: ``pg_advisory_xact_lock`` on a 64-bit hash of (kind, key hash), taken in
  ascending order so two batches never wait for each other in a cycle (a caller's own
  transaction that enqueues key A then key B while another enqueues B then A can still
  deadlock; PostgreSQL then aborts one of them). The lock works through PgBouncer in
  transaction mode: it ends with the transaction.
* SQLite: nothing to do; its writers are serialised from their first write to commit.
* Other backends: no lock; ids order items as they were inserted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from django.db import connections

_LOCK_ALL = (
    "SELECT count(pg_advisory_xact_lock(k)) FROM "
    "(SELECT k FROM unnest(%s::bigint[]) AS k ORDER BY k) AS ordered_keys"
)


def lock_id(kind: str, key_hash: str) -> int:
    """The advisory lock number of a key (signed 64 bits)."""
    digest = hashlib.blake2b(f"nexus_workflows:serial:{kind}:{key_hash}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def lock_keys(using: str, kind: str, key_hashes: Iterable[str | None]) -> None:
    """Lock the serial keys ``key_hashes`` of ``kind`` until the current transaction ends
    (call inside one, before inserting)."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    ids = sorted({lock_id(kind, key) for key in key_hashes if key})
    if not ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_ALL, [ids])

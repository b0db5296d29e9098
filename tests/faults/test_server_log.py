"""The database server's own log: a private PostgreSQL cluster, logging as shipped
(``log_min_error_statement = error``: a failed statement is logged with every value Django
bound into it), must never show a dedupe key or a trigger after enqueues of keys that are
taken — pending, processing-or-done, abandoned, with a serial key, in autocommit mode or
in the caller's transaction. A control error proves that the log does record errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.drains import run_to_end
from tests.faults.servers import PrivatePostgres
from tests.processes import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgresql]

KEY = "visit-key-Canary-Dedupe-7731"
CANARY = "Canary Patientname +52 55 1234 9876"
CONTROL = "nw_control_marker_4412"

DUPLICATES = f"""
from django.db import connection, transaction
from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.models import DeferredWork

trigger = {{"key": {KEY!r}, "patient": {CANARY!r}}}
first = enqueue("test-ledger", trigger)
assert enqueue("test-ledger", trigger) == first
with transaction.atomic():
    assert enqueue("test-ledger", trigger) == first
assert enqueue_many("test-ledger", [trigger]) == [first]
keyed = {{"key": {KEY!r}, "to": {CANARY!r}}}
serial = enqueue("test-flow-serial", keyed)
assert enqueue("test-flow-serial", keyed) == serial
with transaction.atomic():
    assert enqueue("test-flow-serial", keyed) == serial
DeferredWork.objects.filter(pk=first).update(status="abandoned")
assert enqueue("test-ledger", trigger) == first  # revived
DeferredWork.objects.filter(pk=first).update(status="done")
assert enqueue("test-ledger", trigger) is None
with connection.cursor() as cursor:
    try:
        cursor.execute("SELECT 1 / 0 AS {CONTROL}")
    except Exception:
        print("control error sent")
print("every enqueue answered as expected")
"""


def test_duplicate_enqueues_leave_nothing_in_the_servers_log(private_postgres: PrivatePostgres) -> None:
    private_postgres.create_database("nw_server_log")
    url = private_postgres.url("nw_server_log")
    run_to_end("migrate", "--no-input", "-v", "0", url=url)
    run_to_end("shell", "-c", DUPLICATES, url=url)
    log: Path = private_postgres.log
    wait_for(lambda: CONTROL in log.read_text(errors="replace"), timeout=10, what="the control error logged")
    text = log.read_text(errors="replace")
    assert "duplicate key" not in text
    assert KEY not in text
    assert "Canary" not in text

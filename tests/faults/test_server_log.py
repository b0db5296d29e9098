"""The database server's own log: a private PostgreSQL cluster, logging as shipped
(``log_min_error_statement = error``: a failed statement is logged with every value Django
bound into it), must never show a dedupe key or a trigger after enqueues of keys that are
taken — pending, processing-or-done, abandoned, with a serial key, in autocommit mode or
in the caller's transaction — nor the values of the app's writes of patient data that
fail (a trigger's refusal standing in for a lock or statement timeout, or a deadlock). A
control error proves that the log does record errors."""

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


REFUSED = "nw_refused_marker_5519"

PATIENT_DATA_WRITES = [
    "enqueue",
    "enqueue_many",
    "save",
    "journals",
    "journal waiting",
    "reschedule",
    "release",
    "abandon",
    "done",
    "done with history",
    "lost",
    "revive",
    "task enqueue",
    "task abandon",
]

#: Every write of patient data the app makes, each refused by the server: a trigger that
#: raises while the session's ``nw.refuse`` is on. The server logs each failed statement.
FAILED_WRITES = f"""
from datetime import timedelta
from django.db import connection
from nexus_workflows import enqueue, enqueue_many
from nexus_workflows.deferred import transitions
from nexus_workflows.deferred.claims import Claimer
from nexus_workflows.models import DeferredWork

with connection.cursor() as cursor:
    cursor.execute(\"\"\"
        CREATE FUNCTION nw_refuse() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION '{REFUSED}'; END $$;
        CREATE TRIGGER nw_refuse BEFORE INSERT OR UPDATE ON nexus_workflows_deferredwork
        FOR EACH ROW WHEN (current_setting('nw.refuse', true) = 'on') EXECUTE FUNCTION nw_refuse();
    \"\"\")

def refusing(on):
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('nw.refuse', %s, false)", ["on" if on else "off"])

refused = []
def refused_write(name, write):
    refusing(True)
    try:
        write()
    except Exception as error:
        assert "{REFUSED}" in str(error), (name, type(error).__name__)
        refused.append(name)
    finally:
        refusing(False)

patient = {{"key": "k-" + {CANARY!r}, "patient": {CANARY!r}}}
refused_write("enqueue", lambda: enqueue("test-ledger", patient))
refused_write("enqueue_many", lambda: enqueue_many("test-ledger", [patient]))
for number in range(2):
    enqueue("test-ledger", {{"key": f"held-{{number}}"}})
held, other = Claimer(kinds=["test-ledger"], using="default").claim_due(2)
journal = {{"note": {CANARY!r}}}
refused_write("save", lambda: transitions.save_checkpoints(held, journal))
refused_write("journals", lambda: transitions.save_journals([(held, journal)], using="default"))
refused_write("journal waiting", lambda: transitions.save_journal_waiting(held, journal, at_most=1))
error = "ValueError: " + {CANARY!r}
later = timedelta(seconds=1)
refused_write("reschedule", lambda: transitions.reschedule(held, delay=later, error=error))
refused_write("release", lambda: transitions.release_attempt(held, delay=later, reason="r", error=error))
refused_write("abandon", lambda: transitions.abandon(held, error=error, reason="permanent"))
held.return_value = {{"answer": {CANARY!r}}}
refused_write("done", lambda: transitions.finish_done([held]))
held.history = [*held.history, {{"error": error}}]
held.history_changed = True
refused_write("done with history", lambda: transitions.finish_done([held]))
refused_write("lost", lambda: transitions.record_lost(held))
assert transitions.abandon(other, error=error, reason="permanent")
rows = DeferredWork.objects.filter(pk=other.id)
refused_write("revive", lambda: transitions.revive_ids(rows, by="an operator"))
# A Django task: its arguments; then its failure's traceback, appended to its errors.
from tests.testapp import tasks
refused_write("task enqueue", lambda: tasks.record.enqueue("k-" + {CANARY!r}))
tasks.record.enqueue("held-task")
(task,) = Claimer(kinds=[], using="default", queues=None).claim_due(1)
task.error_record = {{"exception_class_path": "builtins.ValueError", "traceback": error}}
refused_write("task abandon", lambda: transitions.abandon(task, error="ValueError", reason="permanent"))
print("refused:", ",".join(refused))
"""


def test_failed_writes_of_patient_data_leave_no_values_in_the_servers_log(
    private_postgres: PrivatePostgres,
) -> None:
    """Each of the app's writes of patient data (a trigger, a journal, an error and the
    history holding it, a return value) that the server refuses is logged as its statement
    with ``$n`` in place of the values, never the values themselves."""
    private_postgres.create_database("nw_failed_writes")
    url = private_postgres.url("nw_failed_writes")
    run_to_end("migrate", "--no-input", "-v", "0", url=url)
    logged = private_postgres.log.stat().st_size
    output = run_to_end("shell", "-c", FAILED_WRITES, url=url)
    assert f"refused: {','.join(PATIENT_DATA_WRITES)}" in output, output

    def written_since() -> str:
        return private_postgres.log.read_bytes()[logged:].decode(errors="replace")

    wait_for(
        lambda: written_since().count(REFUSED) >= len(PATIENT_DATA_WRITES),
        timeout=10,
        what="the refusals logged",
    )
    text = written_since()
    statements = [line for line in text.splitlines() if "STATEMENT:" in line]
    assert len(statements) >= len(PATIENT_DATA_WRITES), text[-3000:]  # each failed write is logged
    # By statement first (the one-line ones), then the whole log (a statement's later lines).
    assert [line.split("STATEMENT:")[1][:40] for line in statements if "Canary" in line] == []
    assert "Canary" not in text

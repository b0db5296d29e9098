"""Shared fixtures. Tests talk to the real database (SQLite, PostgreSQL or MariaDB, by
DATABASE_URL) and, where marked, the real Redis; nothing is mocked."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.db import connection

from nexus_workflows.deferred.registry import Workflow, registry
from tests.processes import ManagePy, database_url

IN_CI = os.environ.get("CI", "").lower() == "true"

# On PostgreSQL, a test that leaves sessions of this process open on the test database fails.
pytest_plugins = ["tests.sessions_guard"]


#: What a database lacks that some tests are about (``@pytest.mark.needs(feature)``), by
#: Django's vendor name. MySQL and MariaDB: partial indexes (so no concurrency caps or
#: serial keys: system check E009) and ``UPDATE … RETURNING`` (claims and done-writes
#: read their rows back by claim token instead). SQLite: row locks (one writer at a time),
#: rolling back writes made with autocommit off (sqlite3 commits before a savepoint), and a
#: server reached over TCP (a test that puts a proxy between them), and renaming an index
#: (Django drops and builds it again there).
FEATURES = (
    "partial_indexes",
    "update_returning",
    "row_locks",
    "autocommit_off_rollback",
    "server",
    "index_rename",
)
LACKING: dict[str, set[str]] = {
    "mysql": {"partial_indexes", "update_returning"},
    "sqlite": {"row_locks", "autocommit_off_rollback", "server", "index_rename"},
}
# How many tests each reason deselected, for the end of the run.
DESELECTED: dict[str, int] = {}
# bin/test runs the tests marked database_independent on one leg per Django line: on the
# others (NW_DATABASE_INDEPENDENT=no) they would run the same code again.
RUN_DATABASE_INDEPENDENT = os.environ.get("NW_DATABASE_INDEPENDENT", "yes") != "no"


def _deselected_because(item: pytest.Item, vendor: str) -> str | None:
    if not RUN_DATABASE_INDEPENDENT and item.get_closest_marker("database_independent"):
        return "marked database_independent (run on another leg of this Django line)"
    if item.get_closest_marker("postgresql") and vendor != "postgresql":
        return "marked postgresql"
    if item.get_closest_marker("mysql") and vendor != "mysql":
        return "marked mysql"
    if item.get_closest_marker("sqlite") and vendor != "sqlite":
        return "marked sqlite"
    for marker in item.iter_markers("needs"):
        (feature,) = marker.args
        if feature not in FEATURES:
            raise pytest.UsageError(f"{item.nodeid}: needs({feature!r}): known features are {FEATURES}")
        if feature in LACKING.get(vendor, set()):
            return f"needs {feature}, which {vendor} lacks"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """bin/test runs its legs as background jobs, and a shell may start those with SIGINT
    ignored (a non-interactive shell's ``&``, or a CI runner's own), which Python then keeps:
    no KeyboardInterrupt ever. Stopped (Ctrl-C, CI's time limit), a leg must still tear its
    fixtures down (the fault suite's private servers and network namespaces)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``postgresql`` (or ``mysql``, ``sqlite``) are deselected (not skipped) on the other
    databases, tests marked ``needs(feature)`` on a database that lacks the feature, and
    tests marked ``database_independent`` where ``NW_DATABASE_INDEPENDENT=no``."""
    vendor = connection.vendor
    selected, deselected = [], []
    for item in items:
        reason = _deselected_because(item, vendor)
        if reason is None:
            selected.append(item)
        else:
            deselected.append(item)
            DESELECTED[reason] = DESELECTED.get(reason, 0) + 1
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected


@pytest.fixture(autouse=True)
def close_leftover_processes() -> Iterator[None]:
    """Kill the ``manage.py`` processes a test left running (one that failed before its
    own clean-up): the next test must not share the database with them."""
    yield
    ManagePy.close_leftovers()


_kind_numbers = itertools.count(1)


@pytest.fixture
def register_workflow() -> Iterator[Callable[..., Workflow]]:
    """Register workflows for one test under unique kinds; unregistered afterwards."""
    registered: list[str] = []

    def register(
        prepare: Callable[..., Any],
        *,
        kind: str | None = None,
        dedupe_key: Callable[[Any], str] | None = None,
        retry_schedule: list[float] | None = None,
        **flow: Any,
    ) -> Workflow:
        kind = kind or f"t{next(_kind_numbers)}-" + re.sub(r"[^A-Za-z0-9]+", "-", prepare.__name__).strip("-")
        workflow = registry.register(
            kind,
            dedupe_key=dedupe_key or (lambda trigger: str(trigger["key"])),
            prepare=prepare,
            retry_schedule=retry_schedule,
            **flow,
        )
        registered.append(kind)
        return workflow

    yield register
    for kind in registered:
        registry.unregister(kind)


@pytest.fixture
def is_postgresql() -> bool:
    return connection.vendor == "postgresql"


@pytest.fixture
def rq_redis() -> Iterator[redis.Redis]:
    """The Redis database fire-and-forget tests use (REDIS_TEST_URL), empty before and
    after the test. Unreachable: a failure in CI, a skip elsewhere."""
    from django.conf import settings

    url = settings.REDIS_TEST_URL
    if not url:
        pytest.fail("REDIS_TEST_URL is empty (embedded mode); these tests need a Redis server")
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except redis.exceptions.ConnectionError as error:
        kwargs = client.connection_pool.connection_kwargs
        message = (
            f"Redis is not reachable at {kwargs.get('host')}:{kwargs.get('port')} (REDIS_TEST_URL): {error}"
        )
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    client.flushdb()  # only this test database, never FLUSHALL
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def rq_burst(rq_redis: redis.Redis) -> Callable[..., int]:
    """Run an in-process RQ SimpleWorker in burst mode; returns the jobs it ran.

    In-process, so it sees workflows registered with ``register_workflow``.
    """
    from rq import SimpleWorker

    from nexus_workflows.fire_and_forget import get_queue

    class CountingWorker(SimpleWorker):
        jobs_run = 0

        def execute_job(self, job: Any, queue: Any) -> Any:
            self.jobs_run += 1
            return super().execute_job(job, queue)

    def burst(*queue_names: str, with_scheduler: bool = False) -> int:
        queues = [get_queue(name) for name in queue_names or ("default",)]
        worker = CountingWorker(queues, connection=queues[0].connection)
        # The worker installs its own SIGINT/SIGTERM handlers; give pytest its own back.
        handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            worker.work(burst=True, with_scheduler=with_scheduler, logging_level="WARNING")
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)
        return worker.jobs_run

    return burst


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for a ``manage.py`` subprocess that shares this test's database,
    test Redis and NEXUS_WORKFLOWS settings (and never a REDIS_URL from outside)."""
    from django.conf import settings

    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_TEST_URL": settings.REDIS_TEST_URL,
            "NEXUS_WORKFLOWS_JSON": json.dumps(settings.NEXUS_WORKFLOWS),
            "PYTHONPATH": str(REPOSITORY),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


REPOSITORY = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def work_table() -> str:
    """The work table's name, quoted for the test database."""
    from nexus_workflows.models import DeferredWork

    return connection.ops.quote_name(DeferredWork._meta.db_table)


class WorkTableChange:
    """Something a test adds to the work table and takes away at its end (``remove``)."""

    def __init__(self) -> None:
        self.installed = False

    def remove(self) -> None:
        if not self.installed:
            return
        with connection.cursor() as cursor:
            self.drop(cursor, work_table())
        self.installed = False

    def drop(self, cursor: Any, table: str) -> None:
        raise NotImplementedError


class WriteBlocker(WorkTableChange):
    """A real trigger that makes matching ``UPDATE``\\s of the work table fail, as a
    constraint, a read-only primary or a bad value would: ``InternalError`` on
    PostgreSQL, ``IntegrityError`` on SQLite and MariaDB (there the trigger signals the
    error number of a failed CHECK, 4025, which Django raises as ``IntegrityError``).
    ``condition`` is SQL over ``NEW``/``OLD``."""

    def install(self, condition: str) -> None:
        table = work_table()
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    "CREATE OR REPLACE FUNCTION nw_test_block() RETURNS trigger LANGUAGE plpgsql AS $$ "
                    "BEGIN RAISE EXCEPTION 'blocked by the test' USING ERRCODE = 'XX000'; END $$"
                )
                cursor.execute(
                    f"CREATE TRIGGER nw_test_block BEFORE UPDATE ON {table} FOR EACH ROW "
                    f"WHEN ({condition}) EXECUTE FUNCTION nw_test_block()"
                )
            elif connection.vendor == "mysql":
                cursor.execute(
                    f"CREATE TRIGGER nw_test_block BEFORE UPDATE ON {table} FOR EACH ROW "
                    f"BEGIN IF ({condition}) THEN {MARIADB_REFUSAL}; END IF; END"
                )
            else:
                cursor.execute(
                    f"CREATE TRIGGER nw_test_block BEFORE UPDATE ON {table} FOR EACH ROW "
                    f"WHEN ({condition}) BEGIN SELECT RAISE(ABORT, 'blocked by the test'); END"
                )
        self.installed = True

    def drop(self, cursor: Any, table: str) -> None:
        if connection.vendor == "postgresql":
            cursor.execute(f"DROP TRIGGER IF EXISTS nw_test_block ON {table}")
        else:
            cursor.execute("DROP TRIGGER IF EXISTS nw_test_block")


#: What a MariaDB trigger raises to refuse a row: the error of a failed CHECK (4025),
#: which Django raises as ``IntegrityError``, as on SQLite (a plain ``SIGNAL SQLSTATE
#: '45000'`` arrives as ``OperationalError``, which the runner takes for an outage).
MARIADB_REFUSAL = "SIGNAL SQLSTATE '23000' SET MYSQL_ERRNO = 4025, MESSAGE_TEXT = 'refused by the test'"


@pytest.fixture
def write_blocker() -> Iterator[WriteBlocker]:
    blocker = WriteBlocker()
    yield blocker
    blocker.remove()


class ProjectRefusal(WorkTableChange):
    """A constraint the app does not know about, added to the work table the way a
    project might: it refuses new rows whose ``column`` holds ``value``. A CHECK constraint
    named ``nw_test_refused`` (PostgreSQL, MariaDB), or a trigger (SQLite, which cannot
    add one to a table). Removed at the end of the test, which must be transactional
    (``django_db(transaction=True)``): on MariaDB DDL commits at once, so a test's
    rollback would not take it away, and the test's savepoints would be gone."""

    def install(self, column: str, value: str) -> None:
        assert not connection.in_atomic_block, "a ProjectRefusal needs django_db(transaction=True)"

        table = work_table()
        quoted = connection.ops.quote_name(column)
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                literal = "'" + value.replace("'", "''") + "'"  # a trigger takes no parameters
                cursor.execute(
                    f"CREATE TRIGGER nw_test_refused BEFORE INSERT ON {table} WHEN NEW.{quoted} = {literal} "
                    "BEGIN SELECT RAISE(ABORT, 'refused by a project trigger'); END"
                )
            else:
                cursor.execute(
                    f"ALTER TABLE {table} ADD CONSTRAINT nw_test_refused CHECK ({quoted} <> %s)", [value]
                )
        self.installed = True

    def drop(self, cursor: Any, table: str) -> None:
        if connection.vendor == "sqlite":
            cursor.execute("DROP TRIGGER IF EXISTS nw_test_refused")
        else:
            cursor.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS nw_test_refused")


@pytest.fixture
def project_refusal() -> Iterator[ProjectRefusal]:
    refusal = ProjectRefusal()
    yield refusal
    refusal.remove()


class SlowDeletes:
    """A real trigger that makes each row deleted from the work table take
    ``seconds_per_row``, as on a bloated table or slow storage (PostgreSQL only: its
    ``pg_sleep``). ``pg_sleep`` rounds up: 0.005 takes 5.1-5.2 ms, 0.01 takes 10.1 ms."""

    def __init__(self) -> None:
        self.installed = False

    def install(self, seconds_per_row: float) -> None:
        from nexus_workflows.models import DeferredWork

        table = connection.ops.quote_name(DeferredWork._meta.db_table)
        self.set_delay(seconds_per_row)
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE TRIGGER nw_test_slow_delete BEFORE DELETE ON {table} FOR EACH ROW "
                "EXECUTE FUNCTION nw_test_slow_delete()"
            )
        self.installed = True

    def set_delay(self, seconds_per_row: float) -> None:
        """Replace the trigger's function: unlike dropping the trigger, this takes no lock
        on the table, so a runner's statements never queue behind it."""
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE OR REPLACE FUNCTION nw_test_slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$ "
                f"BEGIN PERFORM pg_sleep({float(seconds_per_row)!r}); RETURN OLD; END $$"
            )

    def remove(self) -> None:
        if not self.installed or connection.in_atomic_block:
            return  # in the test's transaction, its rollback removes the trigger (even if aborted)
        from nexus_workflows.models import DeferredWork

        table = connection.ops.quote_name(DeferredWork._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS nw_test_slow_delete ON {table}")
            cursor.execute("DROP FUNCTION IF EXISTS nw_test_slow_delete()")
        self.installed = False


@pytest.fixture
def slow_deletes() -> Iterator[SlowDeletes]:
    slow = SlowDeletes()
    yield slow
    slow.remove()


# Figures the fault suite measures (durations, outages, attempts), printed at the end of
# the run so they show in the test log even when the tests pass.
FAULT_FIGURES: list[str] = []


@pytest.fixture
def report_figures() -> Callable[[str], None]:
    def report(line: str) -> None:
        FAULT_FIGURES.append(line)
        print(line)

    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if DESELECTED:
        terminalreporter.section(f"deselected on {connection.vendor}")
        for reason, count in sorted(DESELECTED.items()):
            terminalreporter.write_line(f"{count} test(s): {reason}")
    if FAULT_FIGURES:
        terminalreporter.section("fault figures")
        for line in FAULT_FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def pgbouncer(django_db_setup: Any, django_db_blocker: Any) -> Iterator[Any]:
    """A private PgBouncer in transaction mode in front of the PostgreSQL server the
    "direct" alias connects to. Missing ``pgbouncer``: a failure in CI, a skip elsewhere
    (``bin/test`` installs it)."""
    from django.conf import settings

    from tests.pgbouncer import PgBouncer

    if not PgBouncer.available():
        message = "Debian's pgbouncer is not installed (bin/test installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    direct = settings.DATABASES["direct"]
    bouncer = PgBouncer(
        direct["HOST"] or "127.0.0.1", int(direct["PORT"] or 5432), user=direct["USER"] or "postgres"
    )
    bouncer.start()
    yield bouncer
    bouncer.stop()
    # Its server sessions end a moment after it does; the test database is dropped next.
    with django_db_blocker.unblock():
        from django.db import connections

        from tests.processes import wait_for

        test_database = connections["direct"].settings_dict["NAME"]

        def others() -> int:
            with connections["direct"].cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                    [test_database],
                )
                return cursor.fetchone()[0]

        try:
            wait_for(lambda: others() == 0, timeout=10, what="PgBouncer's server sessions to end")
        except AssertionError:
            # Sessions our private PgBouncer opened on the test database can outlive it on a
            # loaded machine; end them (this database only) so it can be dropped.
            with connections["direct"].cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    [test_database],
                )
            wait_for(lambda: others() == 0, timeout=10, what="the test database's sessions to end")
        connections["direct"].close()

"""Prometheus metrics: the database's figures through the view, a runner's counters on
its own endpoint (a real ``runworkflows --metrics-port`` process scraped over HTTP)."""

from __future__ import annotations

import re
import socket
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import Count
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork, OutcomeCount, Status
from tests.ports import refusing_port
from tests.processes import ManagePy, url_of_test_database, wait_for
from tests.tcp_proxy import TcpProxy
from tests.testapp.models import Ledger

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.5, "STALE_AFTER": 5, "SHUTDOWN_GRACE": 1}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of a Prometheus text exposition."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_the_view_reports_rows_per_kind_and_status_and_the_oldest_due_age(register_workflow: Any) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    idle = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    for key in ("a", "b", "c", "d", "e"):
        enqueue(kind, {"key": f"visit-{key}", "patient": "María López"})
    now = timezone.now()
    DeferredWork.objects.filter(dedupe_key="visit-a").update(next_attempt_at=now - timedelta(minutes=10))
    DeferredWork.objects.filter(dedupe_key="visit-b").update(next_attempt_at=now + timedelta(hours=1))
    DeferredWork.objects.filter(dedupe_key="visit-c").update(
        status=Status.ABANDONED, last_error="Upstream: patient María López not found"
    )
    DeferredWork.objects.filter(dedupe_key="visit-d").update(
        status=Status.PROCESSING, claim_token="t" * 32, heartbeat_at=now
    )
    response = Client().get("/internal/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    body = response.content.decode()
    found = samples(body)
    # visit-a and visit-e are pending (one overdue by ten minutes), visit-b pending later.
    assert found[("nexus_workflows_work", (("kind", kind), ("status", "pending")))] == 3
    assert found[("nexus_workflows_work", (("kind", kind), ("status", "processing")))] == 1
    assert found[("nexus_workflows_work", (("kind", kind), ("status", "abandoned")))] == 1
    assert found[("nexus_workflows_work", (("kind", idle), ("status", "pending")))] == 0
    age = found[("nexus_workflows_oldest_due_age_seconds", (("kind", kind),))]
    assert 600 <= age < 660
    assert found[("nexus_workflows_oldest_due_age_seconds", (("kind", idle),))] == 0
    assert found[("nexus_workflows_runners", (("state", "alive"),))] == 0
    # Labels are kinds and statuses: never a dedupe key, a trigger or an error.
    for text in ("visit-", "María", "Upstream"):
        assert text not in body


def test_the_view_reports_due_rows_of_kinds_no_runner_knows(register_workflow: Any) -> None:
    """Rows of a kind removed from the code (and of a Django task whose module is gone)
    stay pending for ever: a gauge per such kind counts the due ones. Known kinds, tasks
    that load, and rows not yet due are not in it; labels are kinds only."""
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    past = timezone.now() - timedelta(minutes=5)

    def row(kind: str, key: str, **fields: Any) -> None:
        DeferredWork.objects.create(kind=kind, dedupe_key=key, trigger={"p": "María López"}, **fields)

    row(kind, "visit-known", next_attempt_at=past)
    for key in ("visit-1", "visit-2"):
        row("reminders.removed-kind", key, next_attempt_at=past)
    row("reminders.removed-kind", "visit-later", next_attempt_at=timezone.now() + timedelta(hours=1))
    task = {"backend_name": "default", "queue_name": "default", "next_attempt_at": past}
    row("tests.testapp.tasks.add", "visit-task", **task)
    row("tests.testapp.gone_module.send", "visit-gone", **task)
    body = Client().get("/internal/metrics").content.decode()
    found = {
        labels: value
        for (name, labels), value in samples(body).items()
        if name == "nexus_workflows_due_unknown_kind"
    }
    assert found == {
        (("kind", "reminders.removed-kind"),): 2,
        (("kind", "tests.testapp.gone_module.send"),): 1,
    }
    # The kind's oldest due age is still read from the same rows.
    assert samples(body)[("nexus_workflows_oldest_due_age_seconds", (("kind", kind),))] >= 290
    for text in ("visit-", "María"):
        assert text not in body


@pytest.mark.postgresql
def test_the_view_answers_503_when_the_database_does_not() -> None:
    from django.db import connections

    connection = connections["default"]  # pointed at a port held bound, never listening
    with refusing_port() as port:
        saved = dict(connection.settings_dict)
        connection.close()
        connection.settings_dict["PORT"] = port
        try:
            response = Client().get("/internal/metrics")
        finally:
            connection.close()
            connection.settings_dict.update(saved)
    assert response.status_code == 503
    assert b"the database did not answer (OperationalError)" in response.content


def test_a_metrics_port_in_use_is_reported() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            call_command("runworkflows", "--once", "--metrics-port", str(port))


def test_a_bad_metrics_port_is_rejected() -> None:
    with pytest.raises(CommandError, match="must be a TCP port from 0 to 65535"):
        call_command("runworkflows", "--once", "--metrics-port", "70000")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return response.read().decode()


@pytest.mark.slow
def test_an_attempt_a_killed_runner_lost_is_counted_by_the_runner_that_reclaims_it() -> None:
    """A killed runner counts nothing, so the attempt it lost was counted nowhere: the row's
    history said "lost", the runner that took it over showed done 1 and nothing else. That
    runner counts the reclaim, by kind: ``nexus_workflows_reclaimed_total``."""
    from django.db.models.functions import Now

    settings = {**FAST, "STALE_AFTER": 2}
    work = enqueue("test-slow", {"key": "reclaimed", "seconds": 1.5})
    first = ManagePy("runworkflows", "--kind", "test-slow", settings=settings)
    try:
        running = DeferredWork.objects.filter(pk=work, started_at__isnull=False)
        wait_for(running.exists, timeout=20, what="the first attempt to start")
        first.kill()  # SIGKILL: its claim stays, nobody beats it
    finally:
        first.close()
    # And a claim a killed runner held queued, unstarted: no attempt was lost with it.
    queued = enqueue("test-slow", {"key": "queued", "seconds": 0})
    stale_beat = Now() - timedelta(hours=1)
    DeferredWork.objects.filter(pk=queued).update(status=Status.PROCESSING, heartbeat_at=stale_beat)
    second = ManagePy("runworkflows", "--kind", "test-slow", "--metrics-port", "0", settings=settings)
    reclaimed = ("nexus_workflows_reclaimed_total", (("kind", "test-slow"),))
    try:
        second.wait_for_output("/metrics")
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", second.output()).group(1))
        assert samples(scrape(port))[reclaimed] == 0  # at 0 from the start
        both = DeferredWork.objects.filter(pk__in=[work, queued], status=Status.DONE)
        wait_for(lambda: both.count() == 2, timeout=30, what="the reclaimed work")
        done = ("nexus_workflows_attempts_total", (("kind", "test-slow"), ("outcome", "done")))
        wait_for(lambda: samples(scrape(port))[done] == 2, timeout=10, what="both done counted")
        assert samples(scrape(port))[reclaimed] == 1  # the started one only
    finally:
        second.close()
    assert [entry["started"] for entry in DeferredWork.objects.get(pk=work).history] == [True]
    assert [entry["started"] for entry in DeferredWork.objects.get(pk=queued).history] == [False]


@pytest.mark.slow
def test_a_runner_endpoint_scraped_after_a_drain_matches_the_rows() -> None:
    plan = {"done": 12, "retry once": 5, "permanent": 3}
    for outcome, count in plan.items():
        for number in range(count):
            enqueue("test-outcomes", {"key": f"{outcome}-{number}", "outcome": outcome})
    process = ManagePy("runworkflows", "--kind", "test-outcomes", "--metrics-port", "0", settings=FAST)
    try:
        process.wait_for_output("/metrics")
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", process.output()).group(1))
        wait_for(
            lambda: not DeferredWork.objects.filter(status__in=[Status.PENDING, Status.PROCESSING]).exists(),
            timeout=60,
            interval=0.2,
            what="the drain",
        )
        # The runner counts an outcome when it has written it: scrape until the last is in.
        key = ("nexus_workflows_attempts_total", (("kind", "test-outcomes"), ("outcome", "done")))
        wait_for(lambda: samples(scrape(port)).get(key) == 17, timeout=10, what="17 done attempts")
        body = scrape(port)
        assert process.terminate() == 0, process.output()
    finally:
        process.close()
    found = samples(body)
    rows = dict(
        DeferredWork.objects.filter(kind="test-outcomes").values_list("status").annotate(n=Count("pk"))
    )
    assert rows == {Status.DONE: 17, Status.ABANDONED: 3}

    def attempts(outcome: str) -> float:
        return found[("nexus_workflows_attempts_total", (("kind", "test-outcomes"), ("outcome", outcome)))]

    assert attempts("done") == rows[Status.DONE]
    assert attempts("abandoned") == rows[Status.ABANDONED]
    assert attempts("rescheduled") == 5  # the five "retry once" items, once each
    assert found[("nexus_workflows_reclaimed_total", (("kind", "test-outcomes"),))] == 0  # due claims only
    assert attempts("lost") == 0
    assert attempts("released") == 0
    histogram = ("nexus_workflows_attempt_duration_seconds_count", (("kind", "test-outcomes"),))
    assert found[histogram] == 17 + 3 + 5
    assert found[("nexus_workflows_claims_total", ())] == 17 + 3 + 5
    assert found[("nexus_workflows_in_flight", ())] == 0
    assert found[("nexus_workflows_database_outages_total", ())] == 0
    # The database's figures, from the same endpoint.
    work = {
        status: found[("nexus_workflows_work", (("kind", "test-outcomes"), ("status", status)))]
        for status in ("pending", "processing", "abandoned")
    }
    assert work == {"pending": 0, "processing": 0, "abandoned": rows[Status.ABANDONED]}
    assert found[("nexus_workflows_runners", (("state", "alive"),))] == 1
    for _name, labels in found:
        for _, value in labels:
            assert not value.startswith(("done-", "retry once-", "permanent-"))  # no dedupe key


@pytest.mark.slow
def test_a_django_tasks_series_start_at_zero_before_its_first_attempt_ends(tmp_path: Any) -> None:
    """A task path's kind is not registered, so its series cannot be made from the
    registry: one with rows starts at 0 with the runner; one enqueued later, when the
    runner claims it. Either is scraped at 0 before its first outcome, so increase() sees
    the first one (a series first seen at 1 is not an increase)."""
    from tests.testapp import tasks

    later = "tests.testapp.tasks.explode"
    held = "tests.testapp.tasks.hold_once"
    tasks.explode.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")
    process = ManagePy("runworkflows", "--queue", "default", "--metrics-port", "0", settings=FAST)
    release = tmp_path / "release"

    def attempts(kind: str, outcome: str) -> float | None:
        return samples(scrape(port)).get(
            ("nexus_workflows_attempts_total", (("kind", kind), ("outcome", outcome)))
        )

    try:
        process.wait_for_output("/metrics")
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", process.output()).group(1))
        first = samples(scrape(port))
        assert {
            outcome: first.get(("nexus_workflows_attempts_total", (("kind", later), ("outcome", outcome))))
            for outcome in ("done", "rescheduled", "abandoned", "lost", "released")
        } == dict.fromkeys(("done", "rescheduled", "abandoned", "lost", "released"), 0)
        assert first[("nexus_workflows_attempt_duration_seconds_count", (("kind", later),))] == 0
        assert attempts(held, "done") is None  # no row of it yet: no series
        tasks.hold_once.enqueue("now", release_file=str(release))
        wait_for(lambda: Ledger.objects.filter(kind="hold_once").exists(), timeout=30, what="its attempt")
        assert (attempts(held, "done"), attempts(held, "abandoned")) == (0, 0)  # claimed, running
        release.touch()
        wait_for(lambda: attempts(held, "done") == 1, timeout=30, what="its attempt to be counted")
        assert attempts(later, "abandoned") == 0  # not due: never claimed
        assert process.terminate() == 0, process.output()
    finally:
        release.touch()
        process.close()


@pytest.mark.slow
def test_a_task_path_claimed_and_ended_between_two_scrapes_is_first_scraped_at_zero() -> None:
    """Enqueued after the runner started, claimed and done before the next scrape: its
    series exist at 0 from the claim in the runner's memory, but no scrape saw them so:
    the first scrape to show a series shows 0 (so increase() counts the first outcome),
    the next its count. Every other series was first served at 0 at the first scrape."""
    from tests.testapp import tasks

    path = "tests.testapp.tasks.add"
    process = ManagePy("runworkflows", "--queue", "default", "--metrics-port", "0", settings=FAST)

    def done_and_duration() -> tuple[float | None, float | None]:
        scraped = samples(scrape(port))
        return (
            scraped.get(("nexus_workflows_attempts_total", (("kind", path), ("outcome", "done")))),
            scraped.get(("nexus_workflows_attempt_duration_seconds_count", (("kind", path),))),
        )

    try:
        process.wait_for_output("/metrics")
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", process.output()).group(1))
        assert done_and_duration() == (None, None)  # no row of it: no series
        tasks.add.enqueue(1, 2)
        wait_for(
            lambda: DeferredWork.objects.filter(kind=path, status=Status.DONE).exists(),
            timeout=30,
            what="its attempt",
        )
        assert done_and_duration() == (0, 0)
        wait_for(lambda: done_and_duration() == (1, 1), timeout=30, what="its attempt to be counted")
        assert process.terminate() == 0, process.output()
    finally:
        process.close()


@pytest.mark.slow
@pytest.mark.postgresql
def test_an_outage_is_counted_once_and_no_outcome_count_is_lost_or_doubled() -> None:
    from django.db import connection
    from django.db.models import Sum

    settings = connection.settings_dict
    proxy = TcpProxy(settings["HOST"] or "127.0.0.1", int(settings["PORT"] or 5432))
    proxy.start()
    for number in range(300):
        enqueue("test-ledger", {"key": str(number), "sleep": 0.01})
    process = ManagePy(
        "runworkflows",
        "--kind",
        "test-ledger",
        "--metrics-port",
        "0",
        settings={**FAST, "STALE_AFTER": 60, "HEARTBEAT_INTERVAL": 1},
        database_url=url_of_test_database(port=proxy.port),
    )
    try:
        process.wait_for_output("/metrics")
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", process.output()).group(1))
        done = DeferredWork.objects.filter(status=Status.DONE)
        wait_for(lambda: done.count() >= 40, timeout=60, what="some work")
        proxy.cut()
        outages = ("nexus_workflows_database_outages_total", ())
        wait_for(lambda: samples(scrape(port)).get(outages) == 1, timeout=30, what="the outage to be counted")
        proxy.restore()
        wait_for(
            lambda: not DeferredWork.objects.filter(status__in=[Status.PENDING, Status.PROCESSING]).exists(),
            timeout=120,
            interval=0.2,
            what="the rest of the work",
        )
        found = samples(scrape(port))
        assert found[outages] == 1  # one outage, however many retries
        assert process.terminate() == 0, process.output()
        output = process.output()
    finally:
        proxy.close()
        process.close()
    assert DeferredWork.objects.filter(status=Status.DONE).count() == 300
    written = dict(
        OutcomeCount.objects.filter(kind="test-ledger").values_list("outcome").annotate(n=Sum("count"))
    )
    # A batch whose UPDATE committed but whose answer was cut off matches nothing when the
    # runner writes it again; its rows are done by its claim, so they count as done, not
    # lost. Every item is counted exactly once, held through the outage, never doubled.
    summary = re.search(r"runner stopped: (.*)$", output, re.MULTILINE).group(1)
    reported = {name: int(n) for n, name in re.findall(r"(\d+) (\w+)", summary)}
    assert written == {
        outcome: reported[outcome]
        for outcome in ("done", "rescheduled", "abandoned", "lost", "released")
        if reported.get(outcome)
    }, output
    assert (reported["done"], reported.get("lost", 0)) == (300, 0), output
    done = reported["done"]
    label = (("kind", "test-ledger"), ("outcome", "done"))
    assert found[("nexus_workflows_attempts_total", label)] == done


@pytest.mark.slow
@pytest.mark.needs("partial_indexes")  # its kind has a cap and a serial key: refused on MariaDB
def test_flow_limits_are_exported_per_kind_over_http_with_no_key(live_server: Any, tmp_path: Any) -> None:
    """Slots in use and items waiting per limit, for a kind with every limit
    (``test-flow-faults``: concurrency=2, a serial key, 10 starts a second), from a
    runner's endpoint and from the view, each over real HTTP. Labels are kinds and limit
    names: never a key (here phone numbers) nor a dedupe key."""
    kind = "test-flow-faults"
    ledger = str(tmp_path / "ledger")
    phones = [f"+52155500{n:04d}" for n in range(5)]
    for n, phone in enumerate(phones[:2]):  # two attempts that hang: both slots in use
        hang = str(tmp_path / f"h{n}")
        enqueue(kind, {"key": f"hung-{n}", "to": phone, "ledger": ledger, "hang_file": hang})
    process = ManagePy("runworkflows", "--kind", kind, "--metrics-port", "0", settings=FAST)
    try:
        process.wait_for_output("/metrics")
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", process.output()).group(1))
        wait_for(lambda: all((tmp_path / f"h{n}").exists() for n in range(2)), timeout=30, what="two hung")
        # Two more of the hung items' keys (held by their key) and three of other keys
        # (held by the two slots).
        enqueue(kind, {"key": "later-0", "to": phones[0], "ledger": ledger})
        enqueue(kind, {"key": "later-1", "to": phones[1], "ledger": ledger})
        for n, phone in enumerate(phones[2:]):
            enqueue(kind, {"key": f"other-{n}", "to": phone, "ledger": ledger})
        expected = {"key": 2, "slot": 3, "rate": 0}

        def flow_samples(body: str) -> tuple[float | None, dict[str, float | None]]:
            found = samples(body)
            in_use = found.get(("nexus_workflows_flow_slots_in_use", (("kind", kind),)))
            waits = {
                limit: found.get(("nexus_workflows_flow_waiting", (("kind", kind), ("limit", limit))))
                for limit in expected
            }
            return in_use, waits

        wait_for(lambda: flow_samples(scrape(port)) == (2, expected), timeout=10, what="the flow figures")
        from_runner = scrape(port)
        with urllib.request.urlopen(f"{live_server.url}/internal/metrics", timeout=10) as response:
            from_view = response.read().decode()
    finally:
        process.close()  # kill -9: the hung attempts need no shutdown
    assert flow_samples(from_view) == (2, expected)
    for body in (from_runner, from_view):
        for phone in phones:
            assert phone not in body
        assert "hung-" not in body
        assert "later-" not in body


@pytest.mark.postgresql
def test_scrapes_while_the_database_stalls_hold_one_connection_and_still_serve_the_counters(
    monkeypatch: Any,
) -> None:
    """A runner's endpoint serves each scrape on a thread of its own. While the database
    does not answer its figures (here: a lock it waits for), scrapes keep coming (Prometheus
    gives up on each and tries again); each must not hold a connection of its own, and the
    runner's own counters are still served once it has waited SCRAPE_WAIT for the first."""
    import threading
    import time

    from nexus_workflows.observability import metrics as metrics_module
    from nexus_workflows.observability.runner_metrics import RunnerMetrics
    from tests.raw_connections import raw_connection

    monkeypatch.setattr(metrics_module, "SCRAPE_WAIT", 0.3)  # 2 s each otherwise

    metrics = RunnerMetrics(kinds=["test-outcomes"], using="default", in_flight=lambda: 0)
    port = metrics.serve("127.0.0.1", 0)
    locker = raw_connection()
    locker.autocommit = False
    watcher = raw_connection()
    first: list[str] = []
    try:
        locker.execute("LOCK TABLE nexus_workflows_runner IN ACCESS EXCLUSIVE MODE")
        stalled = threading.Thread(target=lambda: first.append(scrape(port)), daemon=True)
        stalled.start()

        def waiting() -> int:
            return watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            ).fetchone()[0]

        wait_for(lambda: waiting() == 1, timeout=10, what="the first scrape to wait for the database")
        started = time.monotonic()
        bodies = [scrape(port) for _ in range(3)]  # each answers once it has waited
        assert time.monotonic() - started >= 3 * 0.3
        assert waiting() == 1  # still only the first scrape's connection
        for body in bodies:
            found = samples(body)
            assert found[("nexus_workflows_in_flight", ())] == 0
            assert ("nexus_workflows_runners", (("state", "alive"),)) not in found
    finally:
        locker.rollback()
        locker.close()
        watcher.close()
    stalled.join(10)
    metrics.stop()
    assert ("nexus_workflows_runners", (("state", "alive"),)) in samples(first[0])  # once the lock went


@pytest.mark.django_db(transaction=True)
def test_two_scrapes_at_the_same_moment_both_get_the_databases_figures(caplog: Any) -> None:
    """Two Prometheus servers (the usual pair) scrape one runner's endpoint at the same
    moment. With the database healthy, both get its figures, and nothing says they are
    missing. The second went without at once before (half the scrapes of 20 rounds, and
    a WARNING/INFO pair per collision)."""
    import logging
    import threading

    from nexus_workflows.observability.runner_metrics import RunnerMetrics

    metrics = RunnerMetrics(kinds=["test-outcomes"], using="default", in_flight=lambda: 0)
    port = metrics.serve("127.0.0.1", 0)
    bodies: list[str] = []
    try:
        with caplog.at_level(logging.DEBUG, logger="nexus_workflows"):
            for _ in range(10):
                together = threading.Barrier(2)

                def one(together: threading.Barrier = together) -> None:
                    together.wait()
                    bodies.append(scrape(port))

                pair = [threading.Thread(target=one) for _ in range(2)]
                for thread in pair:
                    thread.start()
                for thread in pair:
                    thread.join(30)
    finally:
        metrics.stop()
    assert len(bodies) == 20
    assert all(("nexus_workflows_runners", (("state", "alive"),)) in samples(body) for body in bodies)
    assert not [record.getMessage() for record in caplog.records if "metrics:" in record.getMessage()]


def test_a_runners_counters_stay_in_its_process_when_prometheus_multiproc_dir_is_set(tmp_path: Any) -> None:
    """A web server's workers share their counters through ``PROMETHEUS_MULTIPROC_DIR``, and
    the same environment often starts the runner. Its counters must not go there: the web
    process's ``MultiProcessCollector`` would serve them a second time (summed over every
    runner that ever wrote there, never reset), doubling every sum across targets."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    shared = tmp_path / "prometheus"
    shared.mkdir()
    for number in range(3):
        enqueue("test-outcomes", {"key": f"done-{number}", "outcome": "done"})
    process = ManagePy(
        "runworkflows",
        "--kind",
        "test-outcomes",
        "--metrics-port",
        "0",
        settings=FAST,
        env={"PROMETHEUS_MULTIPROC_DIR": str(shared)},
    )
    try:
        process.wait_for_output("/metrics")
        port = int(re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", process.output()).group(1))
        key = ("nexus_workflows_attempts_total", (("kind", "test-outcomes"), ("outcome", "done")))
        wait_for(lambda: samples(scrape(port)).get(key) == 3, timeout=30, what="3 done attempts")
        found = samples(scrape(port))
        assert process.terminate() == 0, process.output()
    finally:
        process.close()
    # The runner's own endpoint serves its counters as before.
    assert found[("nexus_workflows_attempt_duration_seconds_count", (("kind", "test-outcomes"),))] == 3
    every = ("nexus_workflows_attempt_duration_seconds_bucket", (("kind", "test-outcomes"), ("le", "+Inf")))
    assert found[every] == 3
    assert found[("nexus_workflows_claims_total", ())] == 3
    assert found[("nexus_workflows_in_flight", ())] == 0
    assert found[("nexus_workflows_database_outages_total", ())] == 0
    # What a web process of the same environment serves: none of them.
    web = CollectorRegistry()
    MultiProcessCollector(web, path=str(shared))
    assert "nexus_workflows" not in generate_latest(web).decode()

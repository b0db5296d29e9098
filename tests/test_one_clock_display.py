"""The admin and ``manage.py workflows status`` judge "stale", "due" and "ago" by the
database's clock, so a web host whose clock is off shows what the runners see.

Each test runs the web side in a real process whose wall clock libfaketime moves ten
minutes ahead or behind; the rows' times are written by the database's clock.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from nexus_workflows.clock import DatabaseNow, now_plus
from nexus_workflows.models import DeferredWork, Status
from tests.faults.servers import under_faketime
from tests.ports import PortTaken, free_port, start_on_a_free_port
from tests.processes import ManagePy, wait_for

# SQLite's clock is the process's own, which libfaketime moves too: a server database only.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.needs("server")]

OFFSETS = pytest.mark.parametrize("offset", ["+10m", "-10m"], ids=["ten-minutes-ahead", "ten-minutes-behind"])
SETTINGS = {"STALE_AFTER": 60}


def _rows() -> dict[str, int]:
    """A live attempt (heartbeat now), a dead one (heartbeat 2.5 minutes ago, past
    STALE_AFTER: stale for 1.5 minutes), work due in 2 minutes and work due 2 minutes ago:
    all by the database."""
    made = {}
    processing, pending = Status.PROCESSING, Status.PENDING
    statuses = {"live": processing, "dead": processing, "soon": pending, "late": pending}
    for name, status in statuses.items():
        work = DeferredWork.objects.create(kind="test-ledger", dedupe_key=name, status=status, trigger={})
        made[name] = work.pk
    rows = DeferredWork.objects
    rows.filter(pk=made["live"]).update(claimed_at=DatabaseNow(), heartbeat_at=DatabaseNow())
    ago = now_plus(-timedelta(minutes=2.5))
    rows.filter(pk=made["dead"]).update(claimed_at=ago, heartbeat_at=ago)
    DeferredWork.objects.filter(pk=made["soon"]).update(next_attempt_at=now_plus(timedelta(minutes=2)))
    DeferredWork.objects.filter(pk=made["late"]).update(next_attempt_at=now_plus(-timedelta(minutes=2)))
    return made


@OFFSETS
def test_workflows_status_says_how_late_by_the_databases_clock(offset: str) -> None:
    made = _rows()
    process = ManagePy("workflows", "status", settings=SETTINGS, **under_faketime(offset))
    try:
        assert process.wait(60) == 0, process.output()
        output = process.output()
    finally:
        process.close()
    found = re.search(r"Oldest due: test-ledger #(\d+) .*\((\d+)s ago\)", output)
    assert found, output
    assert int(found.group(1)) == made["late"]
    assert 110 <= int(found.group(2)) <= 200, output  # two minutes late, not 2 ± 10
    # The dead attempt: a stale claim, stale for a minute and a half (later than the late
    # item, so not the oldest due), by the database's clock: not stale at all, or 11.5
    # minutes, by a host clock ten minutes off.
    assert "Stale claims (1; " in output, output
    stale = re.search(
        rf"^  oldest: test-ledger #{made['dead']} .*a stale claim, stale since .* \((\d+)s ago;", output, re.M
    )
    assert stale, output
    assert 80 <= int(stale.group(1)) <= 170, output


def _runserver(offset: str, cookie: str) -> tuple[ManagePy, Callable[[str], str]]:
    """``runserver`` under libfaketime, answering on a free port (another one while the one
    picked is taken), and a GET of its pages with ``cookie``."""
    started: list[ManagePy] = []

    def getter(port: int) -> Callable[[str], str]:
        def get(path: str) -> str:
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Cookie": cookie})
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.read().decode()

        return get

    def start(port: int) -> None:
        server = ManagePy(
            "runserver", "--noreload", f"127.0.0.1:{port}", settings=SETTINGS, **under_faketime(offset)
        )
        started.append(server)

        def serving() -> bool:
            try:
                getter(port)("/admin/")
            except OSError:
                return server.process.poll() is not None
            return True

        wait_for(serving, timeout=60, what="runserver answering")
        if server.process.poll() is not None:
            output = server.output()
            server.close()
            if "That port is already in use" in output:
                raise PortTaken(output[-600:])
            raise AssertionError(output)

    port = start_on_a_free_port(start, free_port(), what="runserver")
    return started[-1], getter(port)


@OFFSETS
def test_the_admin_judges_heartbeats_and_due_times_by_the_databases_clock(offset: str) -> None:
    made = _rows()
    user = User.objects.create_superuser("clockwatcher", "clock@example.com", "unused-password")
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    server, get = _runserver(offset, cookie)
    base = "/admin/nexus_workflows/deferredwork/"
    try:
        pages = {name: get(f"{base}{pk}/change/") for name, pk in made.items()}
        attention = get(f"{base}?status=attention")
        listed = get(base)
        index = get("/admin/")
        board = get(f"{base}dashboard/")
        metrics = get("/internal/metrics")
    finally:
        server.close()
    assert "heartbeat stale" not in pages["live"]
    assert "heartbeat" in pages["live"]
    assert "heartbeat stale" in pages["dead"]
    assert "due now" not in pages["soon"]
    assert "due now" in pages["late"]
    shown = set(re.findall(r"#(\d+)</a>", attention))
    assert str(made["dead"]) in shown, shown
    assert str(made["live"]) not in shown, shown
    # The list's cards and the admin index's link: one needs attention, the dead attempt.
    card = r'nw-summary-count">(\d+)</span>\s*<span class="nw-summary-label">([^<]+)<'
    cards = {label: int(count) for count, label in re.findall(card, listed)}
    assert cards["Needs attention"] == 1, cards
    assert cards["Stale heartbeat"] == 1, cards
    assert "Needs attention (1)</a>" in index
    # The dashboard and the metrics count the dead attempt as a stale claim, and the late
    # item (due two minutes ago, the oldest) as two minutes overdue: not twelve, not none.
    panel = board[board.index('data-kind="test-ledger"') :]
    assert re.search(r'<dd class="nw-figure-stale nw-stale"[^>]*>1</dd>', panel), panel[:3000]
    assert re.search(r'nw-figure-oldest[^"]*">2\s+minutes(, \d+\s+seconds)? overdue<', panel), panel[:3000]
    assert 'nexus_workflows_stale_claims{kind="test-ledger"} 1.0' in metrics
    age = re.search(r'nexus_workflows_oldest_due_age_seconds\{kind="test-ledger"\} (\S+)', metrics)
    assert age, metrics
    assert 110 <= float(age.group(1)) <= 200, metrics

"""The dashboard: figures per kind and a server-drawn SVG of outcomes per 5 minutes."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork, OutcomeCount, Status
from nexus_workflows.observability import dashboard
from nexus_workflows.observability.clock import database_now

pytestmark = pytest.mark.django_db

URL = "/admin/nexus_workflows/deferredwork/dashboard/"


def staff(*codenames: str) -> Client:
    user = User.objects.create_user("watcher", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="nexus_workflows", codename__in=codenames)
    )
    client = Client()
    client.login(username="watcher", password="pw")
    return client


def add_count(kind: str, outcome: str, ago: timedelta, count: int) -> None:
    minute = (database_now("default") - ago).replace(second=0, microsecond=0)
    OutcomeCount.objects.create(minute=minute, kind=kind, outcome=outcome, count=count)


def test_counts_land_in_their_5_minute_bucket_and_older_ones_are_left_out(register_workflow: Any) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    add_count(kind, "done", timedelta(0), 4)
    add_count(kind, "done", timedelta(hours=1), 2)
    add_count(kind, "abandoned", timedelta(hours=1), 1)
    add_count(kind, "done", timedelta(hours=25), 99)  # outside the window
    add_count(kind, "lost", timedelta(0), 5)  # not charted
    board = dashboard.build("default")
    panel = next(panel for panel in board.panels if panel.kind == kind)
    assert (panel.total_done, panel.total_rescheduled, panel.total_abandoned) == (6, 0, 1)
    assert panel.series["done"][-1] == 4
    hour_ago = [index for index, n in enumerate(panel.series["done"]) if n == 2]
    assert hour_ago in ([dashboard.BUCKETS - 13], [dashboard.BUCKETS - 12])
    assert panel.series["abandoned"][hour_ago[0]] == 1


def test_the_chart_draws_one_bar_per_outcome_and_bucket_and_escapes_the_kind() -> None:
    series = {name: [0] * dashboard.BUCKETS for name in dashboard.SHOWN}
    series["done"][10] = 3
    series["rescheduled"][10] = 1
    series["abandoned"][200] = 2
    svg = str(dashboard.render_chart('<kind "x">', series, timezone.now() - timedelta(hours=24)))
    assert svg.startswith("<svg")
    assert len(re.findall(r"<rect ", svg)) == 3
    assert '<kind "x">' not in svg
    assert "&lt;kind &quot;x&quot;&gt;: 3 done, 1 rescheduled, 2 abandoned in 24 hours" in svg


def test_the_page_shows_each_kind_with_its_depth_oldest_due_and_chart(register_workflow: Any) -> None:
    kind = register_workflow(lambda t, c, s: None, retry_schedule=[1]).kind
    for key in "abc":
        enqueue(kind, {"key": key})
    DeferredWork.objects.filter(dedupe_key="a").update(next_attempt_at=timezone.now() - timedelta(minutes=42))
    DeferredWork.objects.filter(dedupe_key="c").update(status=Status.DONE)
    add_count(kind, "done", timedelta(minutes=3), 1)
    page = staff("view_deferredwork").get(URL)
    assert page.status_code == 200
    html = page.content.decode()
    section = html[html.index(f'data-kind="{kind}"') :]
    section = section[: section.index("</section>")]
    assert re.search(r'class="nw-figure-pending">2<', section)
    assert "42\xa0minutes overdue" in section
    assert "1 done</span>" in section
    assert '<svg class="nw-chart"' in section
    assert "runners alive" in html or "runner alive" in html


def test_the_page_needs_the_view_permission() -> None:
    assert staff().get(URL).status_code == 403


def test_the_triage_panel_links_to_the_dashboard() -> None:
    html = staff("view_deferredwork").get("/admin/").content.decode()
    assert f'id="nw-dashboard" href="{URL}"' in html
    assert "<strong>0</strong> runners alive" in html

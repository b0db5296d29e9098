"""A killed runner's attempts are stale claims: overdue on every surface an operator reads
(the metrics, the dashboard, ``workflows status``). They showed only as processing, with
an oldest due age of 0 and "nothing overdue", however long nobody ran them."""

from __future__ import annotations

import io
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db.models.functions import Now
from django.test import Client, override_settings
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.observability import dashboard
from nexus_workflows.observability.figures import work_figures
from nexus_workflows.observability.metrics import database_registry
from tests.processes import ManagePy, wait_for

FAST = {"POLL_INTERVAL": 0.1, "HEARTBEAT_INTERVAL": 0.3, "STALE_AFTER": 2, "SHUTDOWN_GRACE": 1}
DASHBOARD = "/admin/nexus_workflows/deferredwork/dashboard/"


def scraped(kind: str) -> dict[str, float]:
    """The database's figures of ``kind`` as a scrape serves them: by metric name, with
    the status after a slash for ``nexus_workflows_work``."""
    text = generate_latest(database_registry()).decode()
    return {
        "/".join(filter(None, [sample.name, sample.labels.get("status")])): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("kind") == kind
    }


def status_output() -> str:
    out = io.StringIO()
    call_command("workflows", "status", stdout=out)
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_runners_attempts_are_stale_and_overdue_on_every_surface(admin_client: Client) -> None:
    keys = [f"visit-{n}-private" for n in range(2)]
    ids = [enqueue("test-slow", {"key": key, "seconds": 600}) for key in keys]
    process = ManagePy("runworkflows", "--kind", "test-slow", "--concurrency", "2", settings=FAST)
    try:
        running = DeferredWork.objects.filter(pk__in=ids, status=Status.PROCESSING, started_at__isnull=False)
        wait_for(lambda: running.count() == 2, timeout=20, what="both attempts to start")
        with override_settings(NEXUS_WORKFLOWS=FAST):
            # A live runner's attempts beat: processing, not stale, nothing overdue (past
            # STALE_AFTER, so a beat that stopped would show).
            first = DeferredWork.objects.get(pk=ids[0]).heartbeat_at
            wait_for(
                lambda: DeferredWork.objects.get(pk=ids[0]).heartbeat_at > first,
                timeout=10,
                what="a heartbeat",
            )
            figures = work_figures("default")
            assert (figures.stale, figures.oldest_due_age("test-slow")) == ({}, 0.0)
            assert scraped("test-slow")["nexus_workflows_stale_claims"] == 0
        process.kill()  # SIGKILL: the claims stay, nobody beats them
    finally:
        process.close()
    with override_settings(NEXUS_WORKFLOWS=FAST):
        wait_for(lambda: work_figures("default").stale == {"test-slow": 2}, timeout=10, what="stale claims")
        # Overdue from the moment they went stale, and more so as time passes.
        wait_for(
            lambda: scraped("test-slow")["nexus_workflows_oldest_due_age_seconds"] >= 1.0,
            timeout=10,
            what="an oldest due age of a second",
        )
        figures = scraped("test-slow")
        assert (figures["nexus_workflows_stale_claims"], figures["nexus_workflows_work/processing"]) == (2, 2)
        panel = next(panel for panel in dashboard.build("default").panels if panel.kind == "test-slow")
        assert (panel.stale_claims, panel.processing) == (2, 2)
        assert panel.oldest_due_text != "nothing overdue"
        assert panel.oldest_due_text.endswith(" overdue")
        page = admin_client.get(DASHBOARD).content.decode()
        assert re.search(r'<dd class="nw-figure-stale nw-stale"[^>]*>2</dd>', page), page
        output = status_output()
    assert "Stale claims (2; processing, heartbeat older than STALE_AFTER: the runner died" in output
    assert re.search(r"^  test-slow  2$", output, re.MULTILINE), output
    claim = (
        rf"test-slow #({ids[0]}|{ids[1]}) \(attempt 1 of \d+\), a stale claim, stale since .* last heartbeat "
    )
    assert re.search(rf"^  oldest: {claim}", output, re.MULTILINE), output
    # Nothing pending is due: the stale claim is the oldest due item, as the metric counts it.
    assert re.search(rf"^Oldest due: {claim}", output, re.MULTILINE), output
    assert not any(key in output or key in page for key in keys)  # kinds and ids only


@pytest.mark.django_db
def test_a_stale_claim_is_due_from_when_it_went_stale() -> None:
    """Its age is its last heartbeat plus STALE_AFTER, up to the database's now; a row with no
    heartbeat at all (written by hand) counts from its last update. A due pending row of the
    same kind that waited longer sets the age instead. (By the database's clock, with the
    host's moved: tests/test_one_clock_display.py.)"""
    stale, unbeaten = (
        enqueue("test-slow", {"key": "a", "seconds": 1}),
        enqueue("test-slow", {"key": "b", "seconds": 1}),
    )
    rows = DeferredWork.objects.filter(pk__in=[stale, unbeaten])
    rows.update(status=Status.PROCESSING, next_attempt_at=Now() + timedelta(hours=1))
    with override_settings(NEXUS_WORKFLOWS={"STALE_AFTER": 60}):
        DeferredWork.objects.filter(pk=stale).update(heartbeat_at=Now() - timedelta(seconds=160))
        DeferredWork.objects.filter(pk=unbeaten).update(
            heartbeat_at=None, updated_at=Now() - timedelta(seconds=70)
        )  # stale since its update: younger than the other
        figures = work_figures("default")
        assert figures.stale == {"test-slow": 2}
        assert 100 <= figures.oldest_due_age("test-slow") < 110  # 160 - 60
        DeferredWork.objects.filter(pk=stale).update(heartbeat_at=Now())  # beats again: live
        figures = work_figures("default")
        assert figures.stale == {"test-slow": 1}
        assert 70 <= figures.oldest_due_age("test-slow") < 80  # from its update
        pending = enqueue("test-slow", {"key": "c", "seconds": 1})
        DeferredWork.objects.filter(pk=pending).update(next_attempt_at=Now() - timedelta(seconds=300))
        assert 300 <= work_figures("default").oldest_due_age("test-slow") < 310


@pytest.mark.django_db
def test_nothing_stale_prints_no_stale_claims_line() -> None:
    enqueue("test-slow", {"key": "a", "seconds": 1})
    assert "Stale claims" not in status_output()

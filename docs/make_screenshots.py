"""Regenerate the triage-desk screenshots in docs/ from real rows.

    .venv/bin/python docs/make_screenshots.py

It migrates a throw-away SQLite database, registers a few workflows shaped like the
platform's, enqueues work and lets the real runner succeed, retry and abandon it (the
errors, checkpoints and history are the runner's own), serves the admin on a free
loopback port and photographs it in headless Chromium (``bin/browser-deps`` installs it).
Nothing outside the temporary directory and the PNGs in docs/ is touched.

The dashboard's last minutes are the runner's own counts; its earlier 23 hours are
*illustrative*: a day of per-minute counts (a daily curve and one upstream incident) is
added to the outcome-count table, since a screenshot cannot wait a day. A real runner runs
in a thread while the pages are photographed, so the runner list and counts are real.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from datetime import UTC, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PASSWORD = "screenshots-only-password"


def configure(database: Path) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{database}"
    os.environ["DEBUG"] = "false"
    os.environ["SECRET_KEY"] = "screenshots-only-secret-key"
    os.environ.setdefault("NEXUS_WORKFLOWS_LOG_LEVEL", "WARNING")
    import django

    django.setup()


class AirtableUnavailable(Exception):
    """Transient: the retry schedule is walked."""


def register_workflows() -> None:
    from nexus_workflows import PermanentError, workflow

    def by_visit(trigger: dict[str, Any]) -> str:
        return f"visit-{trigger['visit_id']}"

    @workflow("send-visit-summary", dedupe_key=by_visit, retry_schedule=[0.01, 0.01])
    def send_visit_summary(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
        if not checkpoints.get("summary_rendered"):
            save({"summary_rendered": True, "summary_id": f"sum_{trigger['visit_id']}_es"})
        if not checkpoints.get("whatsapp_message_id"):
            save({"whatsapp_message_id": "wamid.HBgNNTIxNTUxMjM0NTY3OBUCABEYEjQ2"})
        failures = checkpoints.get("airtable_failures", 0) + 1
        save({"airtable_failures": failures})
        if trigger.get("airtable_down"):
            if failures < 3:
                raise AirtableUnavailable(f"PATCH Visits/{trigger['airtable_record']}: read timed out (10 s)")
            raise AirtableUnavailable(
                f"PATCH https://api.airtable.com/v0/appN3xusCl1n1c/Visits/{trigger['airtable_record']} "
                "failed: HTTP 503 Service Unavailable\n"
                "  after 5 tries (urllib3 Retry on 429/503, backoff 0.1 s)\n"
                '  response: {"error": {"type": "SERVICE_UNAVAILABLE", '
                '"message": "Airtable is temporarily unavailable"}}\n'
                "  the WhatsApp message was sent; only the Airtable update is missing"
            )

    @workflow("sync-airtable-contact", dedupe_key=lambda t: f"contact-{t['contact']}", retry_schedule=[1, 10])
    def sync_contact(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
        if trigger.get("invalid_phone"):
            raise PermanentError(
                "Airtable rejected the record (HTTP 422 INVALID_VALUE_FOR_COLUMN)\n"
                '  table: Contacts, field: "Phone (E.164)"\n'
                '  message: Field "Phone (E.164)" cannot accept the provided value'
            )
        save({"airtable_record": f"rec{trigger['contact']}"})

    @workflow(
        "appointment-reminder", dedupe_key=lambda t: f"appt-{t['appointment_id']}", retry_schedule=[30, 120]
    )
    def appointment_reminder(trigger: dict[str, Any], checkpoints: dict[str, Any], save: Any) -> None:
        if trigger.get("gateway_busy"):
            raise AirtableUnavailable("WhatsApp gateway answered 429 Too Many Requests (retry-after 900 s)")


def make_rows() -> int:
    """Work in every state, made by enqueue and the runner; returns the id to show."""
    from django.utils import timezone

    from nexus_workflows import enqueue
    from nexus_workflows.deferred.claims import Claimer
    from nexus_workflows.deferred.runner import Runner
    from nexus_workflows.models import DeferredWork

    for contact in (3101, 3102, 3103, 3104):
        enqueue("sync-airtable-contact", {"contact": contact, "conversation": f"conv_{contact:x}"})
    enqueue("sync-airtable-contact", {"contact": 3105, "invalid_phone": True, "phone": "<<TELEFONO_1>>"})
    enqueue(
        "appointment-reminder",
        {"appointment_id": 88412, "patient": "<<PERSONA_1>>", "gateway_busy": True},
    )
    enqueue("appointment-reminder", {"appointment_id": 88413, "patient": "<<PERSONA_2>>"}, delay=3 * 3600)
    enqueue("appointment-reminder", {"appointment_id": 88414, "patient": "<<PERSONA_3>>"}, delay=5 * 3600)
    visit = enqueue(
        "send-visit-summary",
        {
            "visit_id": 20481,
            "conversation": "conv_7f3a9c",
            "patient": "<<PERSONA_1>>",
            "phone": "<<TELEFONO_1>>",
            "clinic": "CDMX-Roma",
            "template": "visit-summary-es",
            "airtable_record": "rec8H2kLmQ",
            "airtable_down": True,
        },
    )
    enqueue(
        "send-visit-summary", {"visit_id": 20482, "conversation": "conv_81b2d0", "airtable_record": "recA"}
    )
    # Three runs walk the 0.6-second schedule of send-visit-summary to the end.
    for _ in range(3):
        Runner(once=True, install_signal_handlers=False).run()
        time.sleep(0.8)

    # Two claims as a runner makes them: one live, one whose runner died 20 minutes ago.
    for trigger in ({"contact": 3106}, {"contact": 3107}):
        enqueue("sync-airtable-contact", trigger)
    claimed = Claimer(kinds=["sync-airtable-contact"], using="default").claim_due(2)
    dead = timezone.now() - timedelta(minutes=20)
    DeferredWork.objects.filter(pk=claimed[-1].id).update(heartbeat_at=dead, claimed_at=dead)
    assert visit is not None
    return int(visit)


def backfill_history() -> None:
    """Illustrative per-minute counts for the 23 hours before now (see the docstring)."""
    import math
    import random
    from datetime import datetime

    from nexus_workflows.models import OutcomeCount

    rng = random.Random(20481)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    shapes = {"send-visit-summary": 9, "sync-airtable-contact": 5, "appointment-reminder": 3}
    rows = []
    for minutes_ago in range(30, 24 * 60):
        minute = now - timedelta(minutes=minutes_ago)
        hour = (minute.hour - 6) % 24  # clinics open at 07:00 in Mexico City (UTC-6)
        daytime = max(0.0, math.sin(math.pi * (hour - 7) / 13)) if 7 <= hour <= 20 else 0.0
        incident = 420 <= minutes_ago < 470  # Airtable answering 503 for fifty minutes
        for kind, peak in shapes.items():
            done = rng.gauss(peak * daytime, 0.6) if daytime else rng.random() < 0.05
            done = max(0, round(done))
            rescheduled = rng.random() < 0.03
            abandoned = 0
            if incident and kind != "appointment-reminder":
                rescheduled, done = done + rng.randint(1, 3), 0
                abandoned = int(rng.random() < 0.12)
            figures = {"done": done, "rescheduled": int(rescheduled), "abandoned": abandoned}
            for outcome, count in figures.items():
                if count:
                    rows.append(OutcomeCount(minute=minute, kind=kind, outcome=outcome, count=count))
    OutcomeCount.objects.bulk_create(rows)


def serve() -> tuple[str, Any]:
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadedWSGIServer(("127.0.0.1", 0), QuietHandler)
    server.set_app(StaticFilesHandler(get_wsgi_application()))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}", server


def photograph(base_url: str, detail_id: int) -> None:
    from selenium.webdriver.common.by import By

    from tests.admin.browser import chromium

    width = 1440
    with chromium(width, 900) as driver:
        driver.get(f"{base_url}/admin/login/?next=/admin/")
        driver.find_element(By.NAME, "username").send_keys("operator")
        driver.find_element(By.NAME, "password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
        driver.find_element(By.ID, "nw-needs-attention")

        def shoot(path: str, name: str, height: int | None = None) -> None:
            driver.get(f"{base_url}{path}")
            # The viewport is set exactly (a window size would include the browser's own
            # frame), to the page's full height unless a height is given.
            metrics = {"width": width, "deviceScaleFactor": 1, "mobile": False}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": 900})
            full = driver.execute_script("return document.documentElement.scrollHeight")
            driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride", {**metrics, "height": height or full}
            )
            time.sleep(0.3)
            driver.save_screenshot(str(DOCS / name))
            print(f"wrote docs/{name}")

        shoot("/admin/", "admin-index.png", 640)
        shoot("/admin/nexus_workflows/deferredwork/", "admin-list.png")
        shoot(f"/admin/nexus_workflows/deferredwork/{detail_id}/change/", "admin-detail.png")
        shoot("/admin/nexus_workflows/deferredwork/dashboard/", "admin-dashboard.png")
        shoot("/admin/nexus_workflows/runner/", "admin-runners.png", 360)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="nw-screens-") as directory:
        configure(Path(directory) / "screens.sqlite3")
        from django.contrib.auth.models import User
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        User.objects.create_superuser("operator", "operator@example.org", PASSWORD)
        register_workflows()
        detail_id = make_rows()
        backfill_history()
        from nexus_workflows.deferred.runner import Runner

        # A live runner (in a thread) while the pages are photographed; nothing is due for it.
        runner = Runner(install_signal_handlers=False, kinds=["appointment-reminder"], concurrency=2)
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        base_url, server = serve()
        try:
            time.sleep(1)
            photograph(base_url, detail_id)
        finally:
            server.shutdown()
            runner.request_stop(now=True)
            thread.join(30)


if __name__ == "__main__":
    main()

"""``manage.py demo``: the main job of the quickstart.

Seeds a few demo workflows, serves the admin, and runs the deferred-work runner in this
process until Ctrl-C, so a newcomer can watch work succeed, retry and be abandoned. With
``REDIS_URL`` set it also starts an RQ worker for fire-and-forget workflows.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from nexus_workflows import enqueue
from nexus_workflows.conf import app_settings
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.runner import Runner

# (kind, trigger, what the newcomer should see)
DEMO_WORK: list[tuple[str, dict[str, Any], str]] = [
    ("demo-greet", {"visit": 1}, "succeeds at once"),
    ("demo-greet", {"visit": 2}, "succeeds at once"),
    ("demo-flaky", {"visit": 3, "failures": 1}, "fails once, is retried 6 s later, succeeds"),
    ("demo-doomed", {"visit": 4}, "fails permanently and is abandoned at once"),
    ("demo-exhausted", {"visit": 5}, "fails every time: retried after 6 s and 12 s, then abandoned"),
    ("demo-notify", {"visit": 6}, "fire-and-forget: runs once on RQ (in-process without REDIS_URL)"),
]


class Command(BaseCommand):
    help = "Seed demo workflows, serve the admin and run workflows until Ctrl-C."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_PORT", "8000")))
        parser.add_argument("--no-server", action="store_true", help="Do not serve the admin.")
        parser.add_argument(
            "--run-for", type=float, metavar="SECONDS", help="Stop by itself after this long."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["no_server"] and not port_is_free(options["port"]):
            raise CommandError(
                f"port {options['port']} on 127.0.0.1 is in use by another program, so the admin "
                "cannot be served there. Choose a free port: bin/demo --port 8001 "
                "(or DEMO_PORT=8001 bin/demo)."
            )
        self.seed()
        children: list[subprocess.Popen[bytes]] = []
        if not options["no_server"]:
            children.append(self.start("runserver", f"127.0.0.1:{options['port']}", "--noreload"))
            self.stdout.write(
                f"Admin: http://127.0.0.1:{options['port']}/admin/  (first user: "
                ".venv/bin/python manage.py createsuperuser)"
            )
        if getattr(settings, "REDIS_URL", ""):
            children.append(self.start("rqworker", "--with-scheduler", app_settings.RQ_QUEUE))
            self.stdout.write("RQ worker started for fire-and-forget workflows.")
        self.stdout.write(
            "More work: .venv/bin/python manage.py workflows enqueue demo-flaky "
            '\'{"visit": 9, "failures": 2}\'   Status: .venv/bin/python manage.py workflows status'
        )
        self.stdout.write("Running workflows; Ctrl-C to stop.")
        self.stdout.flush()
        runner = Runner()
        if options["run_for"]:
            timer = threading.Timer(options["run_for"], runner.request_stop)
            timer.daemon = True
            timer.start()
        try:
            stats = runner.run()
        finally:
            for child in children:
                child.terminate()
            for child in children:
                try:
                    child.wait(10)
                except subprocess.TimeoutExpired:
                    child.kill()
        self.stdout.write(f"demo stopped: {stats.summary()}")

    def seed(self) -> None:
        for kind, trigger, expectation in DEMO_WORK:
            if kind not in registry:
                continue
            result = enqueue(kind, trigger)
            if result is None:
                state = "already done (within the retention)"
            else:
                state = f"#{result}" if registry.get(kind).is_deferred else f"job {result}"
            self.stdout.write(f"{kind:<16} visit {trigger['visit']}: {state:<12} {expectation}")

    def start(self, *command: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "manage.py", *command], cwd=settings.BASE_DIR)


def port_is_free(port: int) -> bool:
    """Whether a server could listen on 127.0.0.1:``port`` right now."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True

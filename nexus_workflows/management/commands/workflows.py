from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from nexus_workflows.enqueueing import enqueue
from nexus_workflows.exceptions import WorkflowError
from nexus_workflows.registry import registry
from nexus_workflows.status import build_status_report, render_status_report


class Command(BaseCommand):
    help = "Enqueue workflows and inspect deferred work."

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        enqueue_parser = subcommands.add_parser(
            "enqueue",
            help="Enqueue a workflow: KIND and its trigger as JSON.",
            description="Enqueue a workflow. Prints the id of pending work (or the job id of a "
            "fire-and-forget job), or says why nothing was enqueued.",
        )
        enqueue_parser.add_argument("kind", metavar="KIND")
        enqueue_parser.add_argument("trigger", metavar="TRIGGER-JSON")
        enqueue_parser.add_argument(
            "--delay", type=float, metavar="SECONDS", help="Make the work due this many seconds from now."
        )
        subcommands.add_parser(
            "status",
            help="Counts by kind and status, the oldest due item and the abandoned work.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        handler = getattr(self, f"handle_{options['subcommand']}")
        handler(**options)

    def handle_enqueue(self, *, kind: str, trigger: str, delay: float | None, **_: Any) -> None:
        try:
            parsed = json.loads(trigger)
        except json.JSONDecodeError as error:
            raise CommandError(
                f"TRIGGER-JSON is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
            ) from None
        options = {"delay": delay} if delay is not None else {}
        try:
            result = enqueue(kind, parsed, **options)
        except WorkflowError as error:
            raise CommandError(str(error)) from error
        workflow = registry.get(kind)
        if result is None:
            what = "work" if workflow.is_deferred else "a job"
            self.stdout.write(f"not enqueued: {what} with this dedupe key is already in flight or done")
        elif workflow.is_deferred:
            self.stdout.write(f"enqueued {kind} #{result}")
        else:
            self.stdout.write(f"enqueued job {result}")

    def handle_status(self, **_: Any) -> None:
        self.stdout.write(render_status_report(build_status_report()))

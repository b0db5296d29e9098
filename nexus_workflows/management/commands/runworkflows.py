from __future__ import annotations

import logging
from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from nexus_workflows.exceptions import UnknownQueue, UnknownWorkflow
from nexus_workflows.runner import Runner


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ArgumentTypeError(f"must be a whole number of at least 1, not {value!r}")
    return number


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = 0.0
    if not 0 < number < float("inf"):
        raise ArgumentTypeError(f"must be a number of seconds greater than 0, not {value!r}")
    return number


class Command(BaseCommand):
    help = (
        "Run deferred workflows: claim due work, run it, walk the retry schedule on "
        "failure. Runs until SIGTERM/SIGINT, or with --once until nothing is due."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--kind",
            action="append",
            dest="kinds",
            metavar="KIND",
            help="Only run this workflow kind (repeatable). Default: every registered deferred "
            "kind, unless --queue is given.",
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="QUEUE",
            help="Only run Django tasks of this queue (repeatable). Default: every queue of the "
            "TASKS backends that are nexus_workflows.tasks.DeferredBackend, unless --kind is given.",
        )
        parser.add_argument(
            "--concurrency",
            type=_positive_int,
            metavar="N",
            help="Attempts run at the same time (threads). Default: NEXUS_WORKFLOWS['CONCURRENCY'].",
        )
        parser.add_argument(
            "--poll-interval",
            type=_positive_float,
            metavar="SECONDS",
            help="Sleep between polls when idle. Default: NEXUS_WORKFLOWS['POLL_INTERVAL'].",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="Run everything due now (stale reclaims included) to completion, print a "
            "summary line and exit.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        verbosity = options["verbosity"]
        if verbosity == 0:
            logging.getLogger("nexus_workflows").setLevel(logging.WARNING)
        elif verbosity >= 2:
            logging.getLogger("nexus_workflows").setLevel(logging.DEBUG)
        try:
            runner = Runner(
                kinds=options["kinds"],
                queues=options["queues"],
                concurrency=options["concurrency"],
                poll_interval=options["poll_interval"],
                once=options["once"],
            )
        except (UnknownWorkflow, UnknownQueue) as error:
            raise CommandError(str(error)) from error
        stats = runner.run()
        if options["once"]:
            self.stdout.write(f"runworkflows --once: {stats.summary()}")

from __future__ import annotations

import logging
from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import router

from nexus_workflows.conf import app_settings
from nexus_workflows.deferred.runner import Runner
from nexus_workflows.deferred.runner.dead_connections import detect_dead_connections
from nexus_workflows.deferred.runner.shutdown import end_process
from nexus_workflows.deferred.wakeup import wakeup_alias
from nexus_workflows.exceptions import UnknownQueue, UnknownWorkflow
from nexus_workflows.limits import MAX_THREADS
from nexus_workflows.management.commands._arguments import ArgumentsNotEchoed, seconds, whole_number
from nexus_workflows.management.commands._database import DatabaseUnreachable, require_migrated
from nexus_workflows.models import DeferredWork
from nexus_workflows.observability.logs import install_default_handler, remove_default_handler
from nexus_workflows.observability.metrics_server import Blame, MetricsEndpointUnavailable

#: What --metrics-host takes, for an error that blames it.
METRICS_HOSTS = (
    "give an IP address of this host (127.0.0.1 or ::1 for this host alone, 0.0.0.0 or :: "
    "for all of its interfaces) or a name that resolves to one"
)


def _port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise ArgumentTypeError("must be a TCP port from 0 to 65535 (0 picks a free one)")
    return number


def _metrics_advice(error: MetricsEndpointUnavailable) -> str:
    """What to change when the endpoint cannot listen: the port only when it is to blame;
    the host (not patient data: an address or a name of the deployment) otherwise."""
    if error.blame is Blame.LOOKUP:
        return f"--metrics-host {error.host} does not resolve to an address; {METRICS_HOSTS}"
    if error.blame is Blame.ADDRESS:
        return f"--metrics-host {error.host} is not an address of this host; {METRICS_HOSTS}"
    return "choose another --metrics-port"


class Command(ArgumentsNotEchoed):
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
            type=whole_number(1, MAX_THREADS),
            metavar="N",
            help=f"Attempts run at the same time (threads), at most {MAX_THREADS}. "
            "Default: NEXUS_WORKFLOWS['CONCURRENCY'].",
        )
        parser.add_argument(
            "--poll-interval",
            type=seconds,
            metavar="SECONDS",
            help="Sleep between polls when idle, at most ten years. "
            "Default: NEXUS_WORKFLOWS['POLL_INTERVAL'].",
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="Run everything due now (stale reclaims included) to completion, print a "
            "summary line and exit.",
        )
        parser.add_argument(
            "--metrics-port",
            type=_port,
            metavar="PORT",
            help="Serve Prometheus metrics at http://HOST:PORT/metrics (0 picks a free port; "
            "the start line names it). Default: no metrics endpoint.",
        )
        parser.add_argument(
            "--metrics-host",
            default="127.0.0.1",
            metavar="HOST",
            help="Address the metrics endpoint listens on. Default: 127.0.0.1.",
        )

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's system checks without the databases' own: Django 6.1 runs the models'
        database checks at every command, and on MySQL/MariaDB those connect (for the
        server's version), so a runner started during an outage would end there with a
        traceback instead of waiting for its database as it does (``require_migrated``,
        then the loop's outage rules). ``manage.py check --database`` still runs them."""
        if kwargs.get("databases") is None:
            kwargs["databases"] = []
        super().check(*args, **kwargs)

    def handle(self, *args: Any, **options: Any) -> None:
        # Without the project's own logging for nexus_workflows, print to stderr.
        handler = install_default_handler()
        using = router.db_for_write(DeferredWork)
        try:
            # A silent network (packets dropped, no RST) must not block the runner for the
            # kernel's ~15 minutes: TCP keepalives and a user timeout on its own
            # connections, unless the project set its own (dead_connections.py).
            with detect_dead_connections((using, wakeup_alias(using)), float(app_settings.STALE_AFTER)):
                self._run(options)
        finally:
            remove_default_handler(handler)

    def _run(self, options: dict[str, Any]) -> None:
        verbosity = options["verbosity"]
        if verbosity == 0:
            logging.getLogger("nexus_workflows").setLevel(logging.WARNING)
        elif verbosity >= 2:
            logging.getLogger("nexus_workflows").setLevel(logging.DEBUG)
        try:
            # Without the app's tables a runner would log the same error type forever.
            require_migrated(router.db_for_write(DeferredWork))
        except DatabaseUnreachable:
            if options["once"]:
                raise  # nothing to wait for: a --once run (a cron job) fails now
            # A long-running runner rides out outages, this one too; its log says so.
        try:
            runner = Runner(
                kinds=options["kinds"],
                queues=options["queues"],
                concurrency=options["concurrency"],
                poll_interval=options["poll_interval"],
                once=options["once"],
                metrics_host=options["metrics_host"],
                metrics_port=options["metrics_port"],
            )
        except (UnknownWorkflow, UnknownQueue) as error:
            raise CommandError(str(error)) from error
        try:
            stats = runner.run()
        except MetricsEndpointUnavailable as error:
            # Only the endpoint's own listen: any other OSError goes up with its own message.
            raise CommandError(f"{error}; {_metrics_advice(error)}") from error
        if options["once"]:
            self.stdout.write(f"runworkflows --once: {stats.summary()}")
        given_up = stats.given_up()
        unwritten = (
            f"{given_up} could not be written (the database refused them, not an outage; see "
            "the runner's ERROR lines): their claims go stale"
        )
        if runner.left_running and getattr(self, "_called_from_command_line", False):
            # Not from call_command: that would end the caller's process.
            if options["once"] and given_up:
                self.stderr.write(unwritten)
                end_process(1)
            end_process()
        if options["once"] and given_up:
            raise CommandError(unwritten)  # a cron job must see it: exit status 1

from __future__ import annotations

import json
import sys
from typing import IO, Any

from django.core.management.base import CommandError, CommandParser
from django.db import router

from nexus_workflows import sql
from nexus_workflows.deferred import triage
from nexus_workflows.deferred.enqueue import enqueue
from nexus_workflows.deferred.registry import registry
from nexus_workflows.deferred.status import build_status_report, render_status_report
from nexus_workflows.exceptions import UnknownWorkflow, WorkflowError
from nexus_workflows.flow.rekey import describe_result, rekey
from nexus_workflows.json_values import MAX_DEPTH, text_problem
from nexus_workflows.management.commands._arguments import ArgumentsNotEchoed, number, whole_number
from nexus_workflows.management.commands._database import require_migrated
from nexus_workflows.models import DeferredWork, Status

# The ids of deferred work: a database's 64-bit integers (greater ones raised OverflowError
# on SQLite), from 1.
_WORK_ID = whole_number(1, 2**63 - 1, "the id of deferred work: a whole number")


#: What reads a trigger or a dedupe key from standard input instead of the command line, where
#: ``ps`` (any local user, ``/proc/<pid>/cmdline``) and shell history would keep patient data.
FROM_STDIN = "-"


#: The revive subcommand's exit statuses (its help's epilog; the README says the same).
REVIVE_EXIT_STATUS = (
    "Exit status: 0 when the revive ran, whether it revived anything or not (nothing to revive "
    "is not a failure for a cron job: the last line says so); 1 when the request was refused "
    "(ways of choosing work combined or missing, a key or kind no work can have, an unmigrated "
    "database) or the database failed; 2 when the arguments do not parse (an id that is not "
    "a whole number from 1)."
)


#: The rekey subcommand's exit statuses.
REKEY_EXIT_STATUS = (
    "Exit status: 0 when every unfinished item of KIND carries the keys its trigger gives; 1 when "
    "some do not (a key function failed for them, or a processing item's serial key is held by "
    "another running item of the key: run it again once they have ended), when KIND is not a "
    "deferred workflow registered here, or when the database failed."
)


class Command(ArgumentsNotEchoed):
    help = "Enqueue workflows and inspect deferred work."
    # call_command(..., stdin=...) gives the text that "-" reads (sys.stdin otherwise).
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        subcommands = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
        enqueue_parser = subcommands.add_parser(
            "enqueue",
            help="Enqueue a workflow: KIND and its trigger as JSON.",
            description="Enqueue a workflow. Prints the id of pending work (or, with --reveal, "
            "the job id of a fire-and-forget job: it carries the dedupe key), or says why nothing "
            "was enqueued.",
        )
        enqueue_parser.add_argument("kind", metavar="KIND")
        enqueue_parser.add_argument(
            "trigger",
            metavar="TRIGGER-JSON",
            help="The trigger as JSON, or - to read it from standard input (a trigger on the command "
            "line is seen by every local user through ps and kept in shell history).",
        )
        enqueue_parser.add_argument(
            "--delay", type=number, metavar="SECONDS", help="Make the work due this many seconds from now."
        )
        enqueue_parser.add_argument(
            "--reveal",
            action="store_true",
            help="Print a fire-and-forget job's id, which carries the dedupe key (may be patient data).",
        )
        status_parser = subcommands.add_parser(
            "status",
            help="Counts by kind and status, the oldest due item and the abandoned work.",
            description="Counts by kind and status, the oldest due item and the abandoned work, "
            "named by kind and id with their errors' exception types. Dedupe keys and error "
            "messages may carry patient data: they are printed only with --reveal.",
        )
        status_parser.add_argument(
            "--reveal", action="store_true", help="Also print dedupe keys and error messages (patient data)."
        )
        _add_revive(subcommands)
        _add_rekey(subcommands)

    def handle(self, *args: Any, **options: Any) -> None:
        handler = getattr(self, f"handle_{options['subcommand']}")
        if options["subcommand"] != "enqueue" or _is_deferred(options["kind"]):
            # A fire-and-forget job never touches the database (embedded mode needs none).
            require_migrated(router.db_for_write(DeferredWork))
        handler(**options)

    def handle_enqueue(
        self, *, kind: str, trigger: str, delay: float | None, reveal: bool = False, **options: Any
    ) -> None:
        if trigger == FROM_STDIN:
            trigger = _stdin(options).read()
        try:
            parsed = json.loads(trigger)
        except json.JSONDecodeError as error:
            raise CommandError(
                f"TRIGGER-JSON is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
            ) from None
        except RecursionError:
            raise CommandError(
                f"TRIGGER-JSON is nested too deeply: a trigger nests at most {MAX_DEPTH} containers"
            ) from None
        except ValueError:
            # An integer of more digits than Python converts (sys.get_int_max_str_digits());
            # its message would name the count, not the value, but a trigger's integers stop
            # at 2**63-1 anyway.
            raise CommandError(
                "TRIGGER-JSON has an integer too long to read: a trigger's integers are from "
                "-2**63 to 2**63-1"
            ) from None
        delayed = {"delay": delay} if delay is not None else {}
        try:
            result = enqueue(kind, parsed, **delayed)
        except WorkflowError as error:
            raise CommandError(str(error)) from error
        workflow = registry.get(kind)
        if result is None:
            what = "work" if workflow.is_deferred else "a job"
            self.stdout.write(f"not enqueued: {what} with this dedupe key is already in flight or done")
        elif workflow.is_deferred:
            self.stdout.write(f"enqueued {kind} #{result}")
        elif reveal:
            self.stdout.write(f"enqueued job {result}")
        else:  # the job id is <kind>__<dedupe key>, and keys may be patient data
            self.stdout.write(f"enqueued a {kind} job (--reveal prints its id, which carries the dedupe key)")

    def handle_status(self, *, reveal: bool = False, **_: Any) -> None:
        self.stdout.write(render_status_report(build_status_report(), reveal=reveal))

    def handle_revive(
        self,
        *,
        ids: list[int],
        kind: str | None,
        key: str | None,
        all_abandoned: bool,
        reveal: bool = False,
        **options: Any,
    ) -> None:
        ways = sum([bool(ids), key is not None, all_abandoned])
        if ways != 1:
            raise CommandError(
                "say which work to revive in one way: ID..., or --kind KIND --key KEY, or "
                "--all-abandoned (optionally with --kind KIND)"
            )
        if key is not None and kind is None:
            raise CommandError("--key needs --kind: a dedupe key is unique only within its kind")
        if ids and kind is not None:
            raise CommandError("--kind cannot be combined with ids; give the ids alone")
        if key == FROM_STDIN:  # its first line, without the line's end
            key = _stdin(options).readline().removesuffix("\n").removesuffix("\r")
        _check_text("--key", key)
        _check_text("--kind", kind)
        if ids:
            queryset = DeferredWork.objects.filter(pk__in=ids)
        elif key is not None:
            queryset = DeferredWork.objects.filter(kind=kind, dedupe_key=key)
        else:
            queryset = DeferredWork.objects.filter(status=Status.ABANDONED)
            if kind is not None:
                queryset = queryset.filter(kind=kind)
        using = queryset.select_for_update().db  # where the revive writes (see transitions.revive)
        with sql.for_connection(using).values_sent_apart(using):  # its reads by key too
            result = triage.revive(queryset, by="command line")
        self._report_revive(result, ids=ids, kind=kind, key=key, reveal=reveal)

    def handle_rekey(self, *, kind: str, **_: Any) -> None:
        _check_text("KIND", kind)
        try:
            result = rekey(kind)
        except UnknownWorkflow as error:
            raise CommandError(str(error)) from None
        for line in describe_result(result):
            self.stdout.write(line)
        if not result.complete:
            raise CommandError("not every unfinished item carries its keys (see above)")

    def _report_revive(
        self, result: triage.TriageResult, *, ids: list[int], kind: str | None, key: str | None, reveal: bool
    ) -> None:
        def key_of(ref: triage.WorkRef) -> str:
            # Keys may be patient data. A row gone before it was read has no key to show.
            return f" (key {ref.dedupe_key})" if reveal and ref.dedupe_key is not None else ""

        for ref in result.changed:
            self.stdout.write(f"revived {ref}{key_of(ref)}")
        for ref in result.skipped:
            reason = (
                "it is gone (purged or deleted)"
                if ref.status == triage.GONE
                else f"{ref.status}, not abandoned"
            )
            self.stdout.write(f"skipped {ref}{key_of(ref)}: {reason}")
        found = {ref.pk for ref in [*result.changed, *result.skipped]}
        for missing in sorted(set(ids) - found):
            self.stdout.write(f"skipped #{missing}: no such deferred work")
        if key is not None and not found:
            self.stdout.write(f"skipped: no deferred work of {_kind_named(kind)} with that key")
        if not ids and key is None and not found:  # --all-abandoned
            self.stdout.write("no abandoned work" + (f" of {_kind_named(kind)}" if kind is not None else ""))
        for unregistered in result.unregistered_kinds:
            self.stderr.write(
                f"warning: no workflow is registered for kind {unregistered!r} in this project; "
                "the revived work waits until a runner that knows the kind starts"
            )
        skipped = len(result.skipped) + len(set(ids) - found) + (1 if key is not None and not found else 0)
        # Still exit status 0 (see the help's epilog): a cron job that finds nothing is not failing.
        nothing = "" if result.changed else ": nothing to revive"
        self.stdout.write(f"revived {len(result.changed)}, skipped {skipped}{nothing}")


def _add_revive(subcommands: Any) -> None:
    revive_parser = subcommands.add_parser(
        "revive",
        help="Revive abandoned deferred work: by id, by --kind and --key, or --all-abandoned.",
        description="Revive abandoned deferred work: pending, due now, its next run attempt 1, "
        "error cleared, "
        "checkpoints kept. Work that is not abandoned is skipped (a runner may be working on "
        "it). Prints what was revived and what was skipped, then a last line "
        "'revived N, skipped M', which ends ': nothing to revive' when N is 0.",
        epilog=REVIVE_EXIT_STATUS,
    )
    revive_parser.add_argument(
        "ids", nargs="*", type=_WORK_ID, metavar="ID", help="Ids of deferred work (64-bit, from 1)."
    )
    revive_parser.add_argument("--kind", metavar="KIND", help="With --key, or to narrow --all-abandoned.")
    revive_parser.add_argument(
        "--key",
        metavar="KEY",
        help="The dedupe key (needs --kind), or - to read it from standard input (its first "
        "line): a key on the command line is seen through ps and kept in shell history.",
    )
    revive_parser.add_argument(
        "--all-abandoned", action="store_true", help="Every abandoned item (of --kind, when given)."
    )
    revive_parser.add_argument(
        "--reveal", action="store_true", help="Also print the dedupe keys (they may be patient data)."
    )


def _add_rekey(subcommands: Any) -> None:
    rekey_parser = subcommands.add_parser(
        "rekey",
        help="Compute the serial and rate keys of a kind's unfinished work again from its triggers.",
        description="Compute the serial_key and rate_key hashes of every pending, processing and "
        "abandoned item of KIND again from its trigger, with the key functions registered now "
        "(and the current PHI_HMAC_KEY), and write those that differ. Run it after a deploy "
        "that adds or changes a serial_key or rate_key, or after rotating PHI_HMAC_KEY: keys are "
        "computed at enqueue, so work enqueued before has none or the old ones. Safe while "
        "runners run, and to run again. Prints ids and counts only.",
        epilog=REKEY_EXIT_STATUS,
    )
    rekey_parser.add_argument("kind", metavar="KIND", help="A deferred workflow's kind.")


def _check_text(option: str, value: str | None) -> None:
    """Refuse a key or kind no work can have: PostgreSQL cannot even compare with it."""
    problem = value is not None and text_problem(value)
    if problem:  # the value is never quoted: a key may be patient data
        raise CommandError(
            f"{option}: the value {problem}; it must be valid Unicode text without NUL characters"
        )


def _stdin(options: dict[str, Any]) -> IO[str]:
    return options.get("stdin") or sys.stdin


def _is_deferred(kind: str) -> bool:
    return kind in registry and registry.get(kind).is_deferred


def _kind_named(kind: str | None) -> str:
    """``kind 'name'`` for a kind registered here; else not repeated: the argument may be a
    dedupe key given as the kind (the two swapped), and keys may be patient data."""
    return f"kind {kind!r}" if kind in registry.kinds() else "the kind given (not registered here)"

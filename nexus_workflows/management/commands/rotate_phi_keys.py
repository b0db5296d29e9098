from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import connections, router

from nexus_workflows.conf import app_settings
from nexus_workflows.limits import MAX_BATCH_SIZE
from nexus_workflows.management.commands._arguments import ArgumentsNotEchoed, whole_number
from nexus_workflows.management.commands._database import require_migrated
from nexus_workflows.phi.keys import configured_encryption_keys
from nexus_workflows.phi.models import PhiToken
from nexus_workflows.phi.rotation import rotate_keys


class Command(ArgumentsNotEchoed):
    help = (
        "Re-encrypt every stored PHI surface under the newest key (the first of "
        "NEXUS_WORKFLOWS['PHI_ENCRYPTION_KEYS']). Remove old keys only after this succeeds, "
        "and after every fire-and-forget job sealed under them has run and passed RETENTION."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--batch-size",
            type=whole_number(1, MAX_BATCH_SIZE),
            default=500,
            help=f"Rows read per query, 1 to {MAX_BATCH_SIZE:,} (default 500).",
        )
        parser.add_argument("--database", default=None, help="Database alias (default: the router's choice).")

    def handle(self, *args: Any, batch_size: int, database: str | None, **options: Any) -> None:
        if database is not None and database not in connections.settings:
            # Not echoed: the aliases say what is allowed.
            raise CommandError(
                f"--database must be an alias of DATABASES: {', '.join(map(str, connections.settings))}"
            )
        require_migrated(database or router.db_for_write(PhiToken))
        result = rotate_keys(batch_size=batch_size, using=database)
        current, reformatted = result.already_current + result.reformatted, ""
        if result.reformatted:
            how = "padded now: stored before padding"
            if not app_settings.PHI_PADDING:
                how = "unpadded now: PHI_PADDING is off"
            reformatted = f" ({result.reformatted} of them {how})"
        self.stdout.write(
            f"Rotated {result.rotated} surface(s); {current} already under the newest key{reformatted}."
        )
        others = len(configured_encryption_keys()) - 1
        if others > 0 and not result.failed:
            self.stdout.write(self._which_keys_may_go(others, rotated=result.rotated))
        if result.failed:
            shown = ", ".join(f"#{pk}" for pk in result.failed[:20])
            more = f" and {len(result.failed) - 20} more" if len(result.failed) > 20 else ""
            raise CommandError(
                f"{len(result.failed)} surface(s) could not be rotated (tokens {shown}{more}): no configured "
                "key decrypts them, or they kept changing. Keep the old keys until this succeeds."
            )

    @staticmethod
    def _which_keys_may_go(others: int, *, rotated: int) -> str:
        """Keys are told apart by position only (the first encrypts, the others only
        decrypt), so a new key put anywhere but first looks like an old one: nothing was
        under it, and removing the first key would then make every surface unreadable."""
        later, them = ("the other key", "it") if others == 1 else (f"the {others} other keys", "them")
        if rotated:
            return (
                f"No surface is under {later} now: remove {them} once every fire-and-forget job "
                f"sealed under {them} has run and passed RETENTION."
            )
        return (
            f"Nothing was under {later}. If one of them is a key you have just added, it must be "
            "FIRST in PHI_ENCRYPTION_KEYS (the first key encrypts; the others only decrypt): put it "
            "first and run this again before removing any key. Removing the first key now would "
            "make every surface unreadable."
        )

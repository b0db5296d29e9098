"""System checks for the ``NEXUS_WORKFLOWS`` settings and the registered workflows.

They run with ``manage.py check`` and before every management command, so a runner never
starts on a configuration that would lose or double-run work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register

from nexus_workflows.conf import DEFAULTS, SETTINGS_NAME, app_settings
from nexus_workflows.limits import MAX_BATCH_SIZE, MAX_THREADS
from nexus_workflows.numbers import MAX_SECONDS, is_seconds
from nexus_workflows.redaction import describe

# Settings that are a number of seconds: greater than 0, or 0 or more where named here.
_SECONDS = (
    "RETENTION",
    "STALE_AFTER",
    "HEARTBEAT_INTERVAL",
    "POLL_INTERVAL",
    "WAKEUP_FALLBACK_POLL_INTERVAL",
    "SWEEP_INTERVAL",
    "PURGE_BATCH_SECONDS",
    "SHUTDOWN_GRACE",
    "METRICS_IDLE_TIMEOUT",
)
_ZERO_SECONDS_ALLOWED = ("SHUTDOWN_GRACE",)
# Whole-number settings: (least, most). A runner's DB_CONNECTIONS covers its main loop,
# heartbeat and wake-up listener, and at least one journal writer. limits.py says why
# threads and connections stop at MAX_THREADS and rows of one statement at MAX_BATCH_SIZE.
_COUNTS = {
    "CONCURRENCY": (1, MAX_THREADS),
    "ASYNC_CONCURRENCY": (1, MAX_BATCH_SIZE),
    "BATCH_SIZE": (1, MAX_BATCH_SIZE),
    "PURGE_BATCH_SIZE": (1, MAX_BATCH_SIZE),
    "DB_CONNECTIONS": (4, MAX_THREADS),
    "METRICS_MAX_CONNECTIONS": (1, MAX_THREADS),
}
_BOOLEANS = ("WAKEUP",)


def seconds_rule(*, zero_allowed: bool = False) -> str:
    least = "0 or more" if zero_allowed else "greater than 0"
    return f"a number of seconds {least} and at most {MAX_SECONDS:,.0f} (ten years)"


def is_whole(value: Any, least: int, most: float) -> bool:
    """An int (not a bool) from ``least`` to ``most``."""
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= most


def whole_rule(least: int, most: int) -> str:
    return f"a whole number of at least {least} and at most {most:,}"


def setting_error(name: str, rule: str, value: Any, check_id: str) -> Error:
    """An error for one ``NEXUS_WORKFLOWS`` setting, naming the rule and the default, and
    the type of the value given (never the value: see :func:`describe`)."""
    return Error(
        f"{SETTINGS_NAME}['{name}'] must be {rule}; got {describe(value)}.",
        hint=f"The default is {DEFAULTS[name]!r}.",
        id=check_id,
    )


@register(Tags.compatibility)
def check_settings(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    from django.conf import settings

    raw = getattr(settings, SETTINGS_NAME, {})
    if not isinstance(raw, dict):
        return [
            Error(
                f"{SETTINGS_NAME} must be a dict of settings; got {type(raw).__name__}.",
                hint="For example: NEXUS_WORKFLOWS = {'RETENTION': 86400}.",
                id="nexus_workflows.E001",
            )
        ]
    messages: list[CheckMessage] = _check_unknown_settings(raw)
    valid = True
    for name in _SECONDS:
        zero_allowed = name in _ZERO_SECONDS_ALLOWED
        value = getattr(app_settings, name)
        if not is_seconds(value, zero_allowed=zero_allowed):
            messages.append(
                setting_error(name, seconds_rule(zero_allowed=zero_allowed), value, "nexus_workflows.E002")
            )
            valid = False
    for name, (least, most) in _COUNTS.items():
        value = getattr(app_settings, name)
        if not is_whole(value, least, most):
            messages.append(setting_error(name, whole_rule(least, most), value, "nexus_workflows.E003"))
    for name in _BOOLEANS:
        value = getattr(app_settings, name)
        if not isinstance(value, bool):
            messages.append(setting_error(name, "True or False", value, "nexus_workflows.E005"))
    if valid and app_settings.HEARTBEAT_INTERVAL * 2 > app_settings.STALE_AFTER:
        messages.append(
            Error(
                f"{SETTINGS_NAME}['HEARTBEAT_INTERVAL'] ({app_settings.HEARTBEAT_INTERVAL}s) must be "
                f"at most half of STALE_AFTER ({app_settings.STALE_AFTER}s).",
                hint="Otherwise one late heartbeat makes a live runner's work look abandoned "
                "and another runner reclaims it while it is still running.",
                id="nexus_workflows.E004",
            )
        )
    if valid:
        messages.extend(_check_schedules())
    messages.extend(_check_wakeup_database())
    return messages


def _check_unknown_settings(raw: dict[Any, Any]) -> list[CheckMessage]:
    """Names that are no setting (misspelt, or of another version), named; keys that are
    not strings, only counted: they could be anything, a secret included."""
    unknown = set(raw) - set(DEFAULTS)
    if not unknown:
        return []
    names = sorted(key for key in unknown if isinstance(key, str))
    others = len(unknown) - len(names)
    listed = [*names, *([f"{others} key(s) that are not strings"] if others else [])]
    return [
        Warning(
            f"{SETTINGS_NAME} has unknown setting(s): {', '.join(listed)}.",
            hint=f"Setting names are strings. Known settings: {', '.join(sorted(DEFAULTS))}.",
            id="nexus_workflows.W001",
        )
    ]


def _check_wakeup_database() -> list[CheckMessage]:
    """WAKEUP_DATABASE names a PostgreSQL alias of DATABASES (or is None)."""
    from django.db import connections

    alias = app_settings.WAKEUP_DATABASE
    if alias is None:
        return []
    hint = (
        "Name an alias of DATABASES that connects straight to PostgreSQL (not through a "
        "pooler in transaction mode), or leave it None to listen on the runner's own database."
    )
    if not isinstance(alias, str) or alias not in connections.settings:
        what = "an alias of DATABASES" if isinstance(alias, str) else "a string or None"
        return [
            Error(
                f"{SETTINGS_NAME}['WAKEUP_DATABASE'] must be {what}; got {describe(alias)}. "
                f"DATABASES has: {', '.join(map(repr, connections.settings))}.",
                hint=hint,
                id="nexus_workflows.E020",
            )
        ]
    if connections[alias].vendor != "postgresql":
        return [
            Error(
                f"{SETTINGS_NAME}['WAKEUP_DATABASE'] names {alias!r}, a "
                f"{connections[alias].vendor} database; wake-ups (LISTEN/NOTIFY) need PostgreSQL.",
                hint=hint,
                id="nexus_workflows.E021",
            )
        ]
    return _check_pooled_database()


def _check_pooled_database() -> list[CheckMessage]:
    """With WAKEUP_DATABASE set, the work's own alias presumably goes through a pooler in
    transaction mode: warn about Django options that keep state in a server session."""
    from django.db import connections, router

    from nexus_workflows.models import DeferredWork

    using = router.db_for_write(DeferredWork)
    if using == app_settings.WAKEUP_DATABASE or connections[using].vendor != "postgresql":
        return []
    settings_dict = connections.settings[using]
    messages: list[CheckMessage] = []
    if settings_dict.get("OPTIONS", {}).get("prepare_threshold") is not None:
        messages.append(
            Warning(
                f"DATABASES[{using!r}]['OPTIONS']['prepare_threshold'] is set, so psycopg prepares "
                "statements in the server session; behind a pooler in transaction mode the next "
                "transaction may run on another session that lacks them.",
                hint="Remove it (Django's default, None, prepares nothing), or use PgBouncer 1.21 "
                "or later with max_prepared_statements set.",
                id="nexus_workflows.W020",
            )
        )
    if not settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        messages.append(
            Warning(
                f"DATABASES[{using!r}] lacks DISABLE_SERVER_SIDE_CURSORS = True; QuerySet.iterator() "
                "then opens a server-side cursor, which a pooler in transaction mode loses between "
                "transactions.",
                hint="Set it on every alias that goes through the pooler (WAKEUP_DATABASE is set, "
                "so this one presumably does); nexus_workflows itself uses no server-side cursor.",
                id="nexus_workflows.W021",
            )
        )
    return messages


def _check_schedules() -> list[CheckMessage]:
    from nexus_workflows.deferred.registry import registry

    retention_minutes = app_settings.RETENTION / 60  # valid: check_settings asks only then
    messages: list[CheckMessage] = []
    for workflow in registry:
        if not workflow.is_deferred:
            continue
        longest = max(workflow.retry_schedule or (0,))
        if longest >= retention_minutes:
            messages.append(
                Error(
                    f"workflow {workflow.kind!r} waits up to {longest:g} minutes between attempts, "
                    f"which is not shorter than RETENTION ({retention_minutes:g} minutes).",
                    hint="Raise NEXUS_WORKFLOWS['RETENTION'] or shorten the retry schedule.",
                    id="nexus_workflows.E007",
                )
            )
    return messages


@register(Tags.compatibility)
def check_flow_limits_guarded(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """``concurrency`` and ``serial_key`` hold because the database refuses a second holder
    of a slot or a key (partial unique constraints). A backend without partial indexes
    (MySQL, MariaDB) creates those constraints without their condition or not at all
    (Django's models.W036), so the limits would hold only as far as runners agree."""
    from django.db import connections, router

    from nexus_workflows.models import DeferredWork

    connection = connections[router.db_for_write(DeferredWork)]
    # By vendor, with no query: the check runs before a runner waits for its database.
    database = {"mysql": "MySQL/MariaDB"}.get(connection.vendor, connection.vendor)
    return flow_limit_errors(database, connection.features.supports_partial_indexes)


def flow_limit_errors(database: str, supports_partial_indexes: bool) -> list[CheckMessage]:
    """:func:`check_flow_limits_guarded` for a ``database`` (its name, for the message)
    apart from the connection, so that its rule is tested on every backend."""
    from nexus_workflows.deferred.registry import registry

    if supports_partial_indexes:
        return []
    limited = [
        workflow.kind
        for workflow in registry
        if workflow.flow is not None and (workflow.flow.concurrency is not None or workflow.flow.keyed)
    ]
    return [
        Error(
            f"workflow {kind!r} has a concurrency cap or a serial_key, which the {database} "
            "database cannot enforce: it has no partial unique indexes.",
            hint="Use PostgreSQL (or SQLite) for the deferred work's database, or drop the "
            "limit; rate_limit needs no partial index.",
            id="nexus_workflows.E009",
        )
        for kind in limited
    ]


@register(Tags.compatibility)
def check_time_zone_support(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Claims, heartbeats and due times are the database's time, compared with aware
    datetimes; with USE_TZ off they would be read as local times and the admin fails."""
    from django.conf import settings

    if settings.USE_TZ:
        return _database_time_zone_errors()
    return [
        Error(
            "nexus_workflows needs USE_TZ = True.",
            hint="Claims, heartbeats and due times are timestamps of the database's clock, "
            "stored in UTC; with USE_TZ = False they are misread as local times (work runs "
            "early or late, live work looks stale) and the admin's work pages fail.",
            id="nexus_workflows.E008",
        )
    ]


def _database_time_zone_errors() -> list[CheckMessage]:
    """A database that stores datetimes without a zone (SQLite, MySQL/MariaDB) and has a
    ``TIME_ZONE`` of its own gets Django's datetimes in that zone, but the database's
    clock (``clock.DatabaseNow``) in UTC: the two would be compared as if alike."""
    from django.db import connections, router

    from nexus_workflows.models import DeferredWork

    errors: list[CheckMessage] = []
    for alias in connections:
        connection = connections[alias]
        zone = connection.settings_dict.get("TIME_ZONE")
        if zone is None or connection.features.supports_timezones:
            continue
        if not router.allow_migrate_model(alias, DeferredWork) or _is_utc(zone):
            continue
        errors.append(
            Error(
                f"nexus_workflows needs the database {alias!r} to store datetimes in UTC; its "
                f"TIME_ZONE is {zone!r}.",
                hint="The database's clock, which writes claim, heartbeat, due and finish "
                "times, is UTC, while Django writes and reads datetimes in the database's "
                "TIME_ZONE on a database without time zone support: delays would be lost or "
                "stretched and live work would look stale. Remove TIME_ZONE from this "
                "database's settings (or set it to 'UTC').",
                id="nexus_workflows.E010",
            )
        )
    return errors


def _is_utc(zone: str) -> bool:
    """Whether the time zone named ``zone`` is UTC all year round (an unknown name is not)."""
    from datetime import UTC, datetime, timedelta
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    year = datetime.now(UTC).year
    return all(
        datetime(year, month, 1, tzinfo=UTC).astimezone(tz).utcoffset() == timedelta(0) for month in (1, 7)
    )

"""System checks of the django-rq side of fire-and-forget workflows (ids nexus_workflows.E300
to E304, W305): django-rq installed, the queues configured, and no redis-py release whose
RQ workers can hang at their stop. With ``manage.py check --deploy`` only (they ask the
server): whether the Redis of the queue ``RQ_QUEUE`` names keeps its jobs, which hold the
dedupe horizon (W306 an evicting ``maxmemory-policy``, W307 no persistence, I308 the server
not reached, I309 the server reached but not telling)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import redis
from django.core.checks import CheckMessage, Error, Info, Tags, Warning, register
from redis.backoff import NoBackoff
from redis.retry import Retry

from nexus_workflows.checks import setting_error
from nexus_workflows.conf import SETTINGS_NAME, app_settings
from nexus_workflows.redaction import describe

#: redis-py releases whose ``PubSubWorkerThread.stop()`` waits for the listener thread with
#: no bound: an RQ worker's stop then hangs for up to 60 s, about one stop in 300 (its
#: pub/sub listener may be waiting in ``get_message`` with nothing subscribed). pyproject
#: excludes them; this check covers a project that installs its own pins without our ranges.
HANGING_REDIS_RELEASES = frozenset({"8.2.0"})


@register(Tags.compatibility)
def check_rq_queues(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Fire-and-forget workflows need django-rq and the queue NEXUS_WORKFLOWS names."""
    from django.apps import apps
    from django.conf import settings

    from nexus_workflows.fire_and_forget.embedded import is_embedded

    messages: list[CheckMessage] = []
    if not apps.is_installed("django_rq"):
        messages.append(
            Error(
                "'django_rq' is not in INSTALLED_APPS.",
                hint="Fire-and-forget workflows run on django-rq: add 'django_rq' before "
                "'nexus_workflows' (it also provides `manage.py rqworker` and the queue admin).",
                id="nexus_workflows.E300",
            )
        )
    queues = getattr(settings, "RQ_QUEUES", None)
    if not isinstance(queues, dict) or not queues:
        messages.append(
            Error(
                "RQ_QUEUES must be a non-empty dict of django-rq queues.",
                hint="For example: RQ_QUEUES = {'default': {'URL': REDIS_URL}}, or {'default': "
                "nexus_workflows.fire_and_forget.embedded.embedded_queue()} without a Redis server.",
                id="nexus_workflows.E301",
            )
        )
        return messages
    name = app_settings.RQ_QUEUE
    if not isinstance(name, str) or not name:
        messages.append(
            setting_error("RQ_QUEUE", "the name of a queue in RQ_QUEUES", name, "nexus_workflows.E302")
        )
    elif name not in queues:
        messages.append(
            Error(
                f"{SETTINGS_NAME}['RQ_QUEUE'] ({describe(name)}) is not a queue in RQ_QUEUES "
                f"({', '.join(sorted(map(str, queues)))}).",
                hint="Add the queue to RQ_QUEUES or set RQ_QUEUE to one of those names.",
                id="nexus_workflows.E303",
            )
        )
    for queue_name, config in sorted(queues.items(), key=lambda item: repr(item[0])):
        if is_embedded(config) and config.get("ASYNC", True) is not False:
            messages.append(
                Error(
                    f"RQ_QUEUES[{queue_name!r}] uses an in-process fakeredis server but is asynchronous.",
                    hint="No worker process can see an in-process server, so its jobs would never "
                    "run. Build the entry with nexus_workflows.fire_and_forget.embedded.embedded_queue() "
                    "(which sets ASYNC=False) or point it at a Redis server.",
                    id="nexus_workflows.E304",
                )
            )
    return messages


@register(Tags.compatibility)
def check_redis_release(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """Warn when the installed redis-py is a release under which RQ workers can hang at stop."""
    try:
        installed = metadata.version("redis")
    except metadata.PackageNotFoundError:  # redis-py is a dependency; a vendored copy has no metadata
        return []
    return redis_release_warnings(installed)


def redis_release_warnings(installed: str) -> list[CheckMessage]:
    """W305 when redis-py ``installed`` (a version string) is in :data:`HANGING_REDIS_RELEASES`."""
    if installed not in HANGING_REDIS_RELEASES:
        return []
    return [
        Warning(
            f"redis-py {installed} is installed: an RQ worker's stop can wait up to 60 s on its "
            "pub/sub listener thread (about one stop in 300), so deploys, `rqworker --burst` "
            "and scaling down stall at random.",
            hint="Install another redis-py release (8.1.0 is the one this app is tested with); "
            "nexus_workflows declares redis!=8.2.0.",
            id="nexus_workflows.W305",
        )
    ]


# --- check --deploy: does the queue's Redis keep its jobs? ------------------------------------

#: Seconds ``check --deploy`` waits for the queue's Redis: to connect, and for each answer
#: (one try, no retry), so a server gone from the network never holds ``check`` up long.
PROBE_TIMEOUT = 2.0
# A maxmemory-policy as Redis names them: shown as it is; anything else is not echoed.
_POLICY_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")
_SEE_README = 'README: "Persistence and eviction"'


@register(Tags.compatibility, deploy=True)
def check_rq_redis_keeps_jobs(app_configs: Sequence[Any] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """``check --deploy``: the Redis of the queue of fire-and-forget workflows neither evicts
    jobs (W306) nor loses them at a restart (W307): the dedupe horizon lives in those jobs.
    I308 when it cannot be asked, I309 when it does not tell."""
    queue = _deployed_queue()
    if queue is None:
        return []
    name, config = queue
    client: redis.Redis | None = None
    try:
        client = _probe_client(config)
        memory, persistence, save = _ask(client)
    except Exception as error:  # noqa: BLE001 - a check must not crash `check`; the type says enough
        return [_not_asked(name, error)]
    finally:
        if client is not None:
            _close(client)
    if isinstance(memory, Exception) or isinstance(persistence, Exception):
        refused = memory if isinstance(memory, Exception) else persistence
        return [_cannot_tell(name, "keeps its jobs", f"it refused INFO ({type(refused).__name__})")]
    # redis-py parses a successful INFO into a dict; anything else says nothing.
    memory, persistence = (answer if isinstance(answer, dict) else {} for answer in (memory, persistence))
    return [*_eviction_messages(name, memory), *_persistence_messages(name, persistence, save)]


def _deployed_queue() -> tuple[str, dict[str, Any]] | None:
    """``RQ_QUEUE`` and its ``RQ_QUEUES`` entry when that is a Redis server to ask: ``None``
    for the in-process fakeredis, and for settings the checks above report (E300 to E303)."""
    from django.apps import apps
    from django.conf import settings

    from nexus_workflows.fire_and_forget.embedded import is_embedded

    queues = getattr(settings, "RQ_QUEUES", None)
    name = app_settings.RQ_QUEUE
    if not (apps.is_installed("django_rq") and isinstance(queues, dict) and isinstance(name, str) and name):
        return None
    config = queues.get(name)
    if not isinstance(config, dict) or is_embedded(config):
        return None
    return name, config


def _probe_client(config: dict[str, Any]) -> redis.Redis:
    """A client of the queue's Redis of its own (the queue's client is left as it is):
    built as django-rq builds the queue's, with :data:`PROBE_TIMEOUT` and no retry."""
    from django_rq.connection_utils import get_redis_connection

    bounded: dict[str, Any] = {
        "socket_connect_timeout": PROBE_TIMEOUT,
        "socket_timeout": PROBE_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
    }
    if "SENTINELS" in config:
        # The pool asks the sentinels for the master at connect: they need the bounds too.
        return get_redis_connection(
            {
                **config,
                "SENTINEL_KWARGS": {**config.get("SENTINEL_KWARGS", {}), **bounded},
                "CONNECTION_KWARGS": {**config.get("CONNECTION_KWARGS", {}), **bounded},
            }
        )
    pool = get_redis_connection(config).connection_pool  # builds a client only: no I/O
    return redis.Redis(
        connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class, **{**pool.connection_kwargs, **bounded}
        )
    )


def _ask(client: redis.Redis) -> list[Any]:
    """``INFO memory``, ``INFO persistence`` and ``CONFIG GET save`` in one round trip; a
    command the server refused is its ``ResponseError`` in the list (a refusal that is a
    ``ConnectionError``, NOAUTH or a wrong password, is raised)."""
    pipeline = client.pipeline(transaction=False)
    pipeline.info("memory")
    pipeline.info("persistence")
    pipeline.config_get("save")
    return list(pipeline.execute(raise_on_error=False))


def _close(client: redis.Redis) -> None:
    """Close the probe's connections, and a Sentinel pool's connections to its sentinels."""
    client.close()
    client.connection_pool.disconnect()
    manager = getattr(client.connection_pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()


def _redis_of(name: str) -> str:
    return f"Redis of queue {name!r} ({SETTINGS_NAME}['RQ_QUEUE'])"


def _eviction_messages(name: str, memory: dict[str, Any]) -> list[CheckMessage]:
    """W306 unless ``maxmemory-policy`` is ``noeviction``; I309 when INFO does not say."""
    policy = memory.get("maxmemory_policy")
    if policy is None:
        return [_cannot_tell(name, "evicts jobs", "its INFO memory has no maxmemory_policy")]
    policy = _text(policy)
    if policy == "noeviction":
        return []
    shown = policy if _POLICY_NAME.fullmatch(policy) else "a policy this check does not know"
    if policy.startswith("volatile-"):
        evicts = (
            "evicts keys that have an expiry, which are exactly the finished and failed jobs: "
            "the next enqueue of their dedupe keys runs `prepare` again"
        )
    elif policy.startswith("allkeys-"):
        evicts = (
            "evicts any key: queued jobs, which then never run, and finished and failed ones, "
            "whose dedupe keys then run `prepare` again on their next enqueue"
        )
    else:
        evicts = "may evict jobs: a finished job's dedupe key then runs `prepare` again on its next enqueue"
    unlimited = " (No maxmemory is set now, so nothing is evicted until one is.)"
    return [
        Warning(
            f"The {_redis_of(name)} has maxmemory-policy {shown}: when full it "
            f"{evicts}.{unlimited if str(memory.get('maxmemory')) == '0' else ''}",
            hint="Set `maxmemory-policy noeviction` on that Redis: when full it then refuses "
            "new jobs (enqueue raises QueueUnavailable) instead of forgetting old ones. Keep "
            f"caches on a Redis of their own ({_SEE_README}).",
            id="nexus_workflows.W306",
        )
    ]


def _persistence_messages(name: str, persistence: dict[str, Any], save: Any) -> list[CheckMessage]:
    """W307 when AOF and RDB snapshots are both off; I309 when the server does not say
    (no ``aof_enabled``, or AOF off and ``CONFIG GET save`` refused: managed Redis services
    often disable CONFIG)."""
    restart = "keeps its data across a restart"
    aof = persistence.get("aof_enabled")
    if aof is None:
        return [_cannot_tell(name, restart, "its INFO persistence has no aof_enabled")]
    if str(aof) == "1":
        return []
    points = _save_points(save)
    if points is None:
        said = f"it refused ({type(save).__name__})" if isinstance(save, Exception) else "it did not answer"
        why = f"AOF is off, and CONFIG GET save, which says whether RDB snapshots are on, {said}"
        return [_cannot_tell(name, restart, why)]
    if points.strip():
        return []
    return [
        Warning(
            f"The {_redis_of(name)} has no persistence (AOF off, no RDB snapshots): "
            "a restart forgets every job, queued ones included, and the next enqueue of a "
            "finished job's dedupe key runs `prepare` again.",
            hint="Turn on AOF (`appendonly yes`; with `appendfsync everysec` a crash loses at "
            "most about a second of jobs) or RDB snapshots (e.g. `save 60 1000`, losing the "
            f"jobs since the last snapshot); on a managed Redis, its persistence option ({_SEE_README}).",
            id="nexus_workflows.W307",
        )
    ]


def _not_asked(name: str, error: Exception) -> CheckMessage:
    # Only the type: redis-py's messages name the host and port, a URL's may hold its password.
    return Info(
        f"`check --deploy` could not ask the {_redis_of(name)} whether it keeps its jobs "
        f"({type(error).__name__}; it gives the server {PROBE_TIMEOUT:g} s to connect and to each answer).",
        hint="Run `manage.py check --deploy` where the production Redis is reachable, with the "
        "production settings, or check by hand that it has `maxmemory-policy noeviction` and "
        f"AOF or RDB snapshots ({_SEE_README}).",
        id="nexus_workflows.I308",
    )


def _cannot_tell(name: str, what: str, why: str) -> CheckMessage:
    return Info(
        f"`check --deploy` cannot tell whether the {_redis_of(name)} {what}: {why}.",
        hint="Check on the server, or in the managed service's settings, that it has "
        "`maxmemory-policy noeviction` and AOF or RDB snapshots; then add "
        f"'nexus_workflows.I309' to SILENCED_SYSTEM_CHECKS ({_SEE_README}).",
        id="nexus_workflows.I309",
    )


def _save_points(answer: Any) -> str | None:
    """The ``save`` setting from a ``CONFIG GET save`` answer (``""``: no RDB snapshots)."""
    if not isinstance(answer, dict):
        return None
    points = {_text(key): value for key, value in answer.items()}.get("save")
    return None if points is None else _text(points)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

"""System checks of the django-rq side of fire-and-forget workflows (ids nexus_workflows.E300
to E304, W305): django-rq installed, the queues configured, and no redis-py release whose
RQ workers can hang at their stop."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import metadata
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register

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

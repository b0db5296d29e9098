"""Procrastinate with its Django integration (``procrastinate.contrib.django``), as a
production project would configure it; the worker is ``manage.py procrastinate worker``
(LISTEN/NOTIFY on, its default)."""

from benchmarks.peers.common_settings import *  # noqa: F403

INSTALLED_APPS = [
    "procrastinate.contrib.django",
    "benchmarks.peers.procrastinate_project",
]

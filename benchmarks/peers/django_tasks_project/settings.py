"""django-tasks with its database backend (django-tasks-db), as a production project would
configure it; the worker is ``manage.py db_worker`` (default ``--interval 1``)."""

from benchmarks.peers.common_settings import *  # noqa: F403

INSTALLED_APPS = [
    "django_tasks",
    "django_tasks_db",
    "benchmarks.peers.django_tasks_project",
]

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

"""The development project's error reports, with its own ``project.settings`` (as
``bin/demo`` and a deployment of the project load them): a ``REDIS_URL`` and a
``DATABASE_URL`` with passwords in the environment, which ``runserver`` also puts in
every request's ``META``. Django's own ``AdminEmailHandler`` mails the report of a real
failure, the queue's Redis server not being there. On the old settings both passwords
went out whole."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.ports import refusing_port
from tests.processes import PROJECT_ROOT

REPORT = r"""
import logging, os, sys

import django
django.setup()

import django_rq
from django.conf import settings
from django.core import mail
from django.test import RequestFactory
from django.test.utils import override_settings, setup_test_environment
from django.utils.log import AdminEmailHandler

setup_test_environment()  # mail goes to mail.outbox
request = RequestFactory().get("/visits/", **os.environ)  # as runserver's environ has it

def enqueue_view(request):
    redis_url = settings.REDIS_URL
    django_rq.get_queue("default").connection.ping()

with override_settings(ADMINS=[("Ops", "ops@example.com")]):
    try:
        enqueue_view(request)
    except Exception:
        record = logging.LogRecord(
            "django.request", logging.ERROR, "report.py", 0, "Internal Server Error", (), sys.exc_info()
        )
        record.request = request
        AdminEmailHandler(include_html=True).emit(record)
(message,) = mail.outbox
print(message.body)
print(message.alternatives[0][0])
"""


def test_a_report_of_the_project_hides_the_passwords_inside_its_urls() -> None:
    with refusing_port() as port:  # held, never listening: the connection is refused for real
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DEBUG": "false",
            "SECRET_KEY": "test-only-secret-key-for-the-error-report-test",
            "REDIS_URL": f"redis://nx-user:Redis-Pw-s3cret@127.0.0.1:{port}/4",
            # Never connected to: the report needs no database.
            "DATABASE_URL": "postgres://app:Db-Pw-s3cret@127.0.0.1:1/nx",
        }
        result = subprocess.run(
            [sys.executable, "-c", REPORT],
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    report = result.stdout
    assert "ConnectionError" in report, report[:2000]
    assert "Redis-Pw-s3cret" not in report
    assert "Db-Pw-s3cret" not in report
    assert f"redis://nx-user:********************@127.0.0.1:{port}/4" in report
    assert "postgres://app:********************@127.0.0.1:1/nx" in report

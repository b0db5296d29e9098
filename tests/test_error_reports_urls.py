"""``UrlCredentialsFilter``: Django's error-report filter, and no password written inside a
URL, in settings, in ``request.META`` or in a frame's local variables. Django's own
``ExceptionReporter`` renders the reports."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest
from django.test import RequestFactory, override_settings
from django.views.debug import ExceptionReporter

from nexus_workflows.error_reports import UrlCredentialsFilter, hide_url_passwords

HIDDEN = UrlCredentialsFilter.cleansed_substitute
# Made at run time and never a frame's local: the report shows each frame's source lines
# and local variables, the test's own among them.
IN_SETTING, IN_ENVIRON, BY_NAME = (uuid.uuid4().hex for _ in range(3))


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("redis://:s3cret@cache:6379/0", f"redis://:{HIDDEN}@cache:6379/0"),
        ("postgres://app:p%40ss@db.internal:5432/nx", f"postgres://app:{HIDDEN}@db.internal:5432/nx"),
        ("amqp://app:p@ss@mq//", f"amqp://app:{HIDDEN}@mq//"),  # an "@" not percent-encoded
        ("https://ghp_t0ken@github.com/x.git", f"https://{HIDDEN}@github.com/x.git"),
        (
            "redis://:a1@one:6379,rediss://u:b2@two:6380/1?x=y",
            f"redis://:{HIDDEN}@one:6379,rediss://u:{HIDDEN}@two:6380/1?x=y",
        ),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("https://example.com/users/a@b?to=c@d#e@f", "https://example.com/users/a@b?to=c@d#e@f"),
        ("no URL: user:pass@host", "no URL: user:pass@host"),
    ],
)
def test_the_password_of_every_url_is_hidden(text: str, shown: str) -> None:
    assert hide_url_passwords(text, HIDDEN) == shown


def broken_view(request: Any, redis_url: str, queues: dict[str, Any]) -> None:
    raise ConnectionError("the queue's server did not answer")


def test_django_report_hides_urls_passwords_in_settings_meta_and_frames() -> None:
    url = f"redis://app:{IN_SETTING}@cache:6379/0"
    environ_url = f"postgres://app:{IN_ENVIRON}@db:5432/nx"
    request = RequestFactory().get("/visits/", DATABASE_URL=environ_url)  # runserver's environ
    filter_path = "nexus_workflows.error_reports.UrlCredentialsFilter"
    with override_settings(
        DEFAULT_EXCEPTION_REPORTER_FILTER=filter_path,
        REDIS_URL=url,
        RQ_QUEUES={"default": {"URL": url, "DEFAULT_TIMEOUT": 360}},
        DEBUG=False,
    ):
        try:
            broken_view(request, url, {"default": {"URL": url, "PASSWORD": BY_NAME}})
        except ConnectionError:
            reporter = ExceptionReporter(request, *sys.exc_info())
            reports = reporter.get_traceback_text() + reporter.get_traceback_html()
    for secret in (IN_SETTING, IN_ENVIRON, BY_NAME):
        assert secret not in reports
    assert f"redis://app:{HIDDEN}@cache:6379/0" in reports
    assert f"postgres://app:{HIDDEN}@db:5432/nx" in reports
    assert "the queue&#x27;s server did not answer" in reports  # the rest of the report stays

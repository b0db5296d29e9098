"""Error reports keep patient data out: what Django's ``AdminEmailHandler`` mails (and
error trackers built on Django's reporter send) for an exception with ``DEBUG`` off
holds the request's POST data and every frame's local variables, cleansed only where
``sensitive_post_parameters`` / ``sensitive_variables`` say. The app's entry points that
hold patient data (the admin's find box and reveal pages, ``enqueue``, ``encode``,
``decode``, ``encode_text``) mark theirs, and every frame they call into (SQL parameters
included).

The fault is real: the table the call needs is renamed away for the call, as on a
database whose migrations are behind."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import Model
from django.test import Client
from django.urls import reverse
from django.views.debug import ExceptionReporter

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork
from nexus_workflows.phi import decode, encode, encode_text
from nexus_workflows.phi.cache import token_cache
from nexus_workflows.phi.models import PhiToken, TokenMap

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "Zorbatilde Quixhuatl"
PHONE = "+52 55 8731 4926"
CODE = "whatsapp:+5215587314926"
MARKS = ("zorbatilde", "quixhuatl", "8731 4926", "87314926")


@pytest.fixture(autouse=True)
def _no_cached_maps() -> Iterator[None]:
    """The process's token cache outlives each test's rows: every test starts empty."""
    token_cache.clear()
    yield
    token_cache.clear()


def leaks(text: str) -> list[str]:
    lowered = text.lower()
    return [mark for mark in MARKS if mark in lowered]


@contextmanager
def table_gone(model: type[Model]) -> Iterator[None]:
    """The model's table renamed away (a real database error on every backend), then back."""
    table = model._meta.db_table
    with connection.schema_editor() as editor:
        editor.alter_db_table(model, table, f"{table}_away")
    try:
        yield
    finally:
        with connection.schema_editor() as editor:
            editor.alter_db_table(model, f"{table}_away", table)


def both_forms(reporter: ExceptionReporter) -> str:
    """The e-mail's text (request data, frames) and its HTML part (``include_html=True``,
    as error trackers: every frame's local variables too)."""
    return reporter.get_traceback_text() + reporter.get_traceback_html()


def report_of(call: Callable[[], Any]) -> str:
    """What Django's AdminEmailHandler would mail for the exception ``call`` raises."""
    try:
        call()
    except Exception:  # noqa: BLE001 - any database error: the report is the point
        return both_forms(ExceptionReporter(None, *sys.exc_info(), is_email=True))
    raise AssertionError("the call did not fail")


class _Requests(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def failed_requests() -> Iterator[_Requests]:
    handler = _Requests()
    logger = logging.getLogger("django.request")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def mailed(records: list[logging.LogRecord]) -> str:
    """The report AdminEmailHandler builds from the request logger's 500 record."""
    (record,) = records
    request = getattr(record, "request", None)
    assert record.exc_info
    return both_forms(ExceptionReporter(request, *record.exc_info, is_email=True))


def test_a_find_that_fails_mails_no_typed_key(settings, failed_requests, register_workflow):
    settings.DEBUG = False
    User.objects.create_superuser("boss", "boss@example.org", "pw-pw-pw-pw")
    client = Client(raise_request_exception=False)
    client.login(username="boss", password="pw-pw-pw-pw")
    with table_gone(DeferredWork):
        response = client.post(reverse("admin:nexus_workflows_deferredwork_find"), {"key": NAME})
    assert response.status_code == 500
    report = mailed(failed_requests.records)
    assert "find_view" in report  # the report is the find's
    assert leaks(report) == []


def test_a_token_map_find_that_fails_mails_no_typed_code(settings, failed_requests):
    settings.DEBUG = False
    User.objects.create_superuser("boss", "boss@example.org", "pw-pw-pw-pw")
    client = Client(raise_request_exception=False)
    client.login(username="boss", password="pw-pw-pw-pw")
    with table_gone(TokenMap):
        response = client.post(reverse("admin:nexus_workflows_tokenmap_find"), {"code": CODE})
    assert response.status_code == 500
    report = mailed(failed_requests.records)
    assert "find_view" in report
    assert leaks(report) == []


def test_an_enqueue_that_fails_reports_no_trigger(settings, register_workflow):
    settings.DEBUG = False
    kind = register_workflow(lambda trigger, checkpoints, save: None, retry_schedule=[1]).kind
    with table_gone(DeferredWork):
        report = report_of(lambda: enqueue(kind, {"key": PHONE, "name": NAME}))
    assert "no such table" in report.lower() or "doesn" in report.lower() or "exist" in report.lower()
    assert leaks(report) == []


def test_an_encode_that_fails_reports_neither_code_nor_value(settings):
    settings.DEBUG = False
    with table_gone(PhiToken):
        report = report_of(lambda: encode(CODE, NAME, "PERSONA"))
    assert leaks(report) == []


def test_an_encode_text_that_fails_reports_neither_code_nor_text(settings):
    settings.DEBUG = False
    with table_gone(PhiToken):
        report = report_of(lambda: encode_text(CODE, f"soy {NAME}, mi cel {PHONE}", [(4, 24, "PERSONA")]))
    assert leaks(report) == []


def test_a_decode_that_fails_reports_neither_code_nor_text(settings):
    settings.DEBUG = False
    token = encode(CODE, NAME, "PERSONA")
    token_cache.clear()  # decode reads the map from the database
    with table_gone(PhiToken):
        report = report_of(lambda: decode(CODE, f"hola {token}, {NAME}"))
    assert leaks(report) == []


def test_a_reveal_whose_audit_fails_mails_no_surface(settings, failed_requests):
    # The surface was decrypted; writing the reveal's audit entry fails: no page, and the
    # report holds neither the surface nor the code.
    settings.DEBUG = False
    User.objects.create_superuser("boss", "boss@example.org", "pw-pw-pw-pw")
    client = Client(raise_request_exception=False)
    client.login(username="boss", password="pw-pw-pw-pw")
    encode(CODE, NAME, "PERSONA")
    token = PhiToken.objects.get()
    with table_gone(LogEntry):
        response = client.post(reverse("admin:nexus_workflows_phitoken_reveal", args=[token.pk]))
    assert response.status_code == 500
    report = mailed(failed_requests.records)
    assert "reveal_view" in report
    assert leaks(report) == []


def test_a_reveal_page_that_fails_to_render_mails_no_surface(settings, failed_requests):
    # Rendering fails after the surface was decrypted and the reveal audited: a static
    # file missing from the manifest (collectstatic not run for this release). The
    # template's frames hold the page's context, the surface included.
    settings.DEBUG = False
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.ManifestStaticFilesStorage"},
    }
    settings.STATIC_ROOT = "/nonexistent-static-root"
    User.objects.create_superuser("boss", "boss@example.org", "pw-pw-pw-pw")
    client = Client(raise_request_exception=False)
    client.login(username="boss", password="pw-pw-pw-pw")
    encode(CODE, NAME, "PERSONA")
    token = PhiToken.objects.get()
    response = client.post(reverse("admin:nexus_workflows_phitoken_reveal", args=[token.pk]))
    assert response.status_code == 500
    report = mailed(failed_requests.records)
    assert "manifest" in report.lower()
    assert leaks(report) == []

"""Error reports keep patient data out: what Django's ``AdminEmailHandler`` mails (and
error trackers built on Django's reporter send) for an exception with ``DEBUG`` off
holds the request's POST data and every frame's local variables, cleansed only where
``sensitive_post_parameters`` / ``sensitive_variables`` say. The app's entry points that
hold patient data (the admin's find box, reveal pages and triage actions, ``enqueue``, the
Tasks backend's ``enqueue`` and ``get_result``, ``encode``, ``decode``, ``encode_text``,
``normalize``) mark theirs, and every frame they call into (SQL parameters included).

The faults are real: the table the call needs is renamed away for the call, as on a
database whose migrations are behind; or another session holds the row (or SQLite's
write lock) and the write's wait for it is cut short."""

from __future__ import annotations

import logging
import sqlite3
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
from django.utils import timezone
from django.views.debug import ExceptionReporter

from nexus_workflows import enqueue
from nexus_workflows.models import DeferredWork, Status
from nexus_workflows.phi import decode, encode, encode_text, normalize
from nexus_workflows.phi.cache import token_cache
from nexus_workflows.phi.models import PhiToken, TokenMap
from nexus_workflows.tasks.compat import task_backends
from tests.raw_connections import row_locked
from tests.testapp.tasks import record

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


@contextmanager
def writes_of_row_refused(pk: int) -> Iterator[None]:
    """Another session holds row ``pk`` (SQLite: the database's write lock), and this
    session's wait for it is cut short: a write of the row fails, a read does not."""
    try:
        if connection.vendor == "sqlite":
            holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            try:
                connection.ensure_connection()
                connection.connection.execute("PRAGMA busy_timeout = 200")
                yield
            finally:
                holder.close()
            return
        with row_locked(DeferredWork, pk):
            with connection.cursor() as cursor:
                if connection.vendor == "mysql":
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
                else:
                    cursor.execute("SET lock_timeout = '200ms'")
            yield
    finally:
        connection.close()  # the session's wait setting goes with it


@pytest.mark.parametrize("action", ["revive", "run_now"])
@pytest.mark.parametrize("how", ["button", "list action"])
def test_a_triage_action_that_fails_mails_no_key_nor_error_message(settings, failed_requests, action, how):
    # The rows read for the compare-and-set hold the dedupe key and, in their history,
    # error messages (shown to reveal holders only; the person clicking may not be one).
    settings.DEBUG = False
    error = f"UpstreamRejected: no WhatsApp account for {NAME}"
    work = DeferredWork.objects.create(
        kind="test-ledger",
        dedupe_key=PHONE,
        trigger={"name": NAME},
        status=Status.ABANDONED if action == "revive" else Status.PENDING,
        last_error=error if action == "revive" else "",
        history=[{"at": timezone.now().isoformat(), "attempt": 1, "outcome": "abandoned", "error": error}],
    )
    User.objects.create_superuser("boss", "boss@example.org", "pw-pw-pw-pw")
    client = Client(raise_request_exception=False)
    client.login(username="boss", password="pw-pw-pw-pw")
    if how == "button":
        url = reverse(f"admin:nexus_workflows_deferredwork_{action}", args=[work.pk])
        data: dict[str, Any] = {}
    else:
        url = reverse("admin:nexus_workflows_deferredwork_changelist")
        names = {"revive": "revive_selected", "run_now": "run_selected_now"}
        data = {"action": names[action], "_selected_action": [work.pk]}
    with writes_of_row_refused(work.pk):
        response = client.post(url, data)
    assert response.status_code == 500
    report = mailed(failed_requests.records)
    assert "triage.py" in report  # the report is the action's
    assert leaks(report) == []
    work.refresh_from_db()
    assert work.status == (Status.ABANDONED if action == "revive" else Status.PENDING)  # not written


def app_frames_leaking(call: Callable[[], Any]) -> list[str]:
    """The app's frames (and the database layer's below them) whose variables show patient
    data in the report of the exception ``call`` raises. The caller's frames above the
    app's (Django's ``Task.enqueue``, a view) are the caller's to mark."""
    try:
        call()
    except Exception:  # noqa: BLE001 - any error: the report is the point
        reporter = ExceptionReporter(None, *sys.exc_info(), is_email=True)
    else:
        raise AssertionError("the call did not fail")
    return [
        f"{frame['function']}:{name}"
        for frame in reporter.get_traceback_frames()
        if "nexus_workflows" in frame["filename"] or "django/db" in frame["filename"]
        for name, shown in frame["vars"]
        if leaks(str(shown))
    ]


def test_a_task_enqueue_that_fails_reports_no_arguments(settings):
    settings.DEBUG = False
    with table_gone(DeferredWork):
        assert app_frames_leaking(lambda: record.enqueue(f"{NAME} {PHONE}")) == []
    # Refused arguments (not JSON): the app's frames hold them too.
    assert app_frames_leaking(lambda: record.enqueue(f"{NAME} {PHONE}", object())) == []


def test_a_task_result_that_cannot_be_read_reports_no_arguments(settings):
    settings.DEBUG = False
    result = record.enqueue(f"{NAME} {PHONE}")
    # Its stored errors are no error records (a hand edit): the row cannot become a result. (A
    # task whose module moved away no longer fails: its result carries a stand-in task.)
    DeferredWork.objects.filter(dedupe_key=result.id).update(errors=["not an error record"])
    assert app_frames_leaking(lambda: task_backends["default"].get_result(result.id)) == []


def test_a_normalize_that_refuses_its_value_reports_no_value(settings):
    settings.DEBUG = False
    assert app_frames_leaking(lambda: normalize(f"{NAME} tel 8731", "TELEFONO")) == []

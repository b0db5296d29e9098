"""``UrlCredentialsFilter``: Django's error-report filter, and no password written inside a
URL, in settings, in ``request.META`` or in a frame's local variables. Django's own
``ExceptionReporter`` renders the reports."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import pytest
import redis
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


def reported_request() -> Any:
    """A request whose reports use the filter (Django caches the one its setting names at
    the first report of the process: a setting overridden later is not read again)."""
    request = RequestFactory().get("/visits/")
    request.exception_reporter_filter = UrlCredentialsFilter()
    return request


def view_with_odd_locals(request: Any, url: str) -> None:
    looped: list[Any] = [url]
    looped.append(looped)  # a list holding itself
    nested: list[Any] = [url]
    for _ in range(5000):  # a JSON body nested deeper than the recursion limit
        nested = [nested]
    raise ConnectionError("the queue's server did not answer")


def test_a_frame_variable_the_walk_cannot_follow_is_hidden_and_the_report_still_made() -> None:
    """A list holding itself, and one nested deeper than the recursion limit: the walk
    into a frame's variables raised RecursionError (on the old code: "RecursionError:
    maximum recursion depth exceeded"), which lost the whole report (the debug page, the
    mail to ADMINS). Django's own report shows such values; this one hides them whole."""
    url = f"redis://app:{IN_SETTING}@cache:6379/0"
    request = reported_request()
    with override_settings(DEBUG=False):
        try:
            view_with_odd_locals(request, url)
        except ConnectionError:
            reporter = ExceptionReporter(request, *sys.exc_info())
            reports = reporter.get_traceback_text() + reporter.get_traceback_html()
    assert IN_SETTING not in reports
    assert f"redis://app:{HIDDEN}@cache:6379/0" in reports  # the plain local, as before
    assert "the queue&#x27;s server did not answer" in reports


def test_a_url_redis_py_parsed_is_shown_without_its_password() -> None:
    """A ``REDIS_URL`` whose port is mistyped: redis-py's ``parse_url`` raises while its
    frame holds the URL parsed by urllib (``ParseResult(netloc=':password@cache:6a79')``,
    no "://" in it). On the old code the report showed that netloc whole."""
    url = f"redis://:{IN_SETTING}@cache:6a79/0"
    request = reported_request()
    with override_settings(DEBUG=False):
        try:
            redis.Redis.from_url(url)
        except ValueError:
            reporter = ExceptionReporter(request, *sys.exc_info())
            reports = reporter.get_traceback_text() + reporter.get_traceback_html()
    assert "parse_url" in reports  # the frame is in the report
    assert IN_SETTING not in reports
    assert f"netloc=&#x27;:{HIDDEN}@cache:6a79&#x27;" in reports


def test_strings_in_a_frames_list_are_walked_as_before() -> None:
    """The walk's short cut for a list's strings (no name to hide them by) still hides a
    URL's password and keeps the rest, and a dict's keys named like a secret still hide
    their values (a guard)."""
    walked = UrlCredentialsFilter().cleanse_special_types(
        None, ["redis://:pw1@cache:6379/0", "plain", ("rediss://u:pw2@two/1",), {"password": "pw3"}]
    )
    assert walked == [
        f"redis://:{HIDDEN}@cache:6379/0",
        "plain",
        (f"rediss://u:{HIDDEN}@two/1",),
        {"password": HIDDEN},
    ]


# One secret per place, so that a failure names the place that leaked.
IN_KEY, IN_SET, IN_FROZENSET, IN_BYTES, IN_SETTING_KEY = (uuid.uuid4().hex for _ in range(5))


def view_with_urls_out_of_the_walk(
    request: Any, clients: dict[str, Any], urls: set[str], **more: Any
) -> None:
    raise ConnectionError("the queue's server did not answer")


def test_urls_in_dict_keys_sets_and_bytes_are_shown_without_their_passwords() -> None:
    """Django's walk keeps a dict's keys, a set and bytes as they are: on the old code each
    secret below was in the report (the first assertion failed on IN_KEY)."""
    request = reported_request()
    with override_settings(DEBUG=False, NW_CLIENTS_BY_URL={f"redis://:{IN_SETTING_KEY}@settinghost/0": 1}):
        try:
            view_with_urls_out_of_the_walk(
                request,
                {f"redis://app:{IN_KEY}@keyhost:6379/0": "a client"},
                {f"redis://:{IN_SET}@sethost:6379/0", "plain"},
                frozen=frozenset({f"rediss://u:{IN_FROZENSET}@frozenhost/1"}),
                # Not UTF-8 only: "Å" is 0xC3 0x85, and 0x85 is white space read as Latin-1.
                raw=b"redis://:" + IN_BYTES.encode() + "Å".encode() + b"\xff@byteshost:6379/0",
            )
        except ConnectionError:
            reporter = ExceptionReporter(request, *sys.exc_info())
            reports = reporter.get_traceback_text() + reporter.get_traceback_html()
    for secret in (IN_KEY, IN_SET, IN_FROZENSET, IN_BYTES, IN_SETTING_KEY):
        assert secret not in reports
    for shown in ("app:{}@keyhost:6379/0", ":{}@sethost:6379/0", "u:{}@frozenhost/1", ":{}@byteshost:6379/0"):
        assert shown.format(HIDDEN) in reports  # the user and host stay
    assert f"redis://:{HIDDEN}@settinghost/0" in reports
    assert "the queue&#x27;s server did not answer" in reports


def test_the_new_walks_keep_what_holds_no_url_and_never_raise() -> None:
    walk = UrlCredentialsFilter().cleanse_special_types
    assert walk(None, {"plain": 1, 2: "x", ("redis://:pw@h/0", 3): 4}) == {
        "plain": 1,
        2: "x",
        (f"redis://:{HIDDEN}@h/0", 3): 4,
    }
    assert walk(None, {"redis://:a@h/0", "redis://:b@h/0"}) == {f"redis://:{HIDDEN}@h/0"}  # one, now
    assert walk(None, bytearray(b"x redis://u:pw@h")) == bytearray(f"x redis://u:{HIDDEN}@h".encode())
    assert walk(None, b"\xff\xfe no URL") == b"\xff\xfe no URL"

    class Hashable(dict):  # a set item Django's walk turns into a plain (unhashable) dict
        __hash__ = object.__hash__  # type: ignore[assignment]

    assert walk(None, {Hashable(a=1)}) == HIDDEN  # hidden whole, not an error

"""Error reports without the passwords written inside URLs.

Django's ``SafeExceptionReporterFilter`` hides a setting (or a ``request.META`` entry)
by its name: one matching ``API|AUTH|TOKEN|KEY|SECRET|PASS|SIGNATURE``. A password inside
a URL (``REDIS_URL = "redis://:password@host:6379/0"``, ``RQ_QUEUES``' ``URL``, a
``DATABASE_URL`` in the environment, which ``runserver`` hands to every request's
``META``) is under no such name, and went out whole in the debug page and in the
reports mailed to ``ADMINS``. :class:`UrlCredentialsFilter` also replaces the password of
every ``scheme://user:password@host`` in those values, and in a frame's local variables
(a string, or a plain dict, list, tuple, set or frozenset of them: a URL on its way to the
Redis client, and a URL urllib has parsed: its netloc), with Django's substitute; the user
and the host stay, to tell which server it was. Also in a dict's keys (a dict of clients by
URL), and in bytes (a URL read from a socket or a file), which are read as ASCII with any
other byte kept as it is: the report shows the bytes with the password replaced, the host
kept, as for a string. A value the walk cannot follow (a list holding itself, nesting
deeper than the recursion limit) is hidden whole: an error raised here would lose the
report itself.

Use it with ``DEFAULT_EXCEPTION_REPORTER_FILTER = "nexus_workflows.error_reports.UrlCredentialsFilter"``.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import ParseResult, SplitResult

from django.http import HttpRequest
from django.views.debug import SafeExceptionReporterFilter

# Where a URL's authority ends: its path, query or fragment, or a space.
_AUTHORITY_END = re.compile(r"[/?#\s]")
# A scheme, just before a "://": looked for in the few characters before it only, so a
# long text (a trigger in a frame's variables) is read once, never once per character.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*\Z")
_SCHEME_LONGEST = 32
# Values walked into in a frame's variables: these exact types, not a subclass that
# shows itself otherwise (request.POST is a dict too, and Django cleanses it by its own rules).
_PLAIN = (str, bytes, bytearray, dict, list, tuple, set, frozenset)
# A URL parsed by urllib (redis-py's parse_url holds one while it reads the port and the
# query): its netloc keeps "user:password@host", with no "://" before it.
_PARSED = (ParseResult, SplitResult)
# Dict keys walked: those that may hold a URL and stay hashable when cleansed.
_KEYS = (str, bytes, tuple, frozenset)


def hide_url_passwords(text: str, substitute: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` in it replaced
    by ``substitute``; a userinfo without a ":" (a token used as the user) as a whole. The
    userinfo ends at the authority's last "@" (a password's "@" not percent-encoded too)."""
    separators = [match.start() for match in re.finditer("://", text)]
    pieces: list[str] = []
    done = 0
    for number, separator in enumerate(separators):
        scheme = _SCHEME.search(text, max(done, separator - _SCHEME_LONGEST), separator)
        if scheme is None:
            continue
        start = separator + 3
        # Not into the next URL (a list of them in one value: "redis://…,redis://…").
        limit = (
            _scheme_start(text, separators[number + 1], start) if number + 1 < len(separators) else len(text)
        )
        end = _AUTHORITY_END.search(text, start, limit)
        userinfo, at, _ = text[start : end.start() if end else limit].rpartition("@")
        if not at:
            continue
        user, colon, _ = userinfo.partition(":")
        pieces += [text[done:start], f"{user}:" if colon else "", substitute]
        done = start + len(userinfo)
    return "".join([*pieces, text[done:]])


def hide_bytes_url_passwords(data: bytes, substitute: str) -> bytes:
    """:func:`hide_url_passwords` for bytes. Read as ASCII, a byte above 127 becomes a lone
    surrogate (``surrogateescape``), which no pattern here matches and which encodes back
    to that byte: never an error, whatever the bytes, and every other byte kept. (Latin-1
    would read UTF-8's 0x85 and 0xA0 as white space, ending the authority inside a
    password such as "Å".) Encoded back as UTF-8, which is ASCII for everything else and
    takes any substitute."""
    if b"://" not in data:
        return data
    text = hide_url_passwords(data.decode("ascii", "surrogateescape"), substitute)
    return text.encode("utf-8", "surrogateescape")


def hide_netloc_password(netloc: str, substitute: str) -> str:
    """A parsed URL's ``user:password@host`` with the password replaced by ``substitute``
    (a userinfo without a ":" as a whole), as :func:`hide_url_passwords` does."""
    userinfo, at, host = netloc.rpartition("@")
    if not at:
        return netloc
    user, colon, _ = userinfo.partition(":")
    return f"{user}:{substitute}@{host}" if colon else f"{substitute}@{host}"


def _scheme_start(text: str, separator: int, floor: int) -> int:
    """Where the scheme before the "://" at ``separator`` begins (not before ``floor``)."""
    scheme = _SCHEME.search(text, max(floor, separator - _SCHEME_LONGEST), separator)
    return scheme.start() if scheme else separator


class UrlCredentialsFilter(SafeExceptionReporterFilter):
    """Django's filter, and no password of a URL in settings, ``META`` or frame variables."""

    def cleanse_setting(self, key: Any, value: Any) -> Any:
        if type(value) is str and key == "":
            # A string in a list (a frame's list of a million of them is walked): no name
            # to hide it by, and most hold no URL; Django's own walk would return it as is.
            return hide_url_passwords(value, self.cleansed_substitute) if "://" in value else value
        cleansed = super().cleanse_setting(key, value)
        if isinstance(cleansed, str):
            return hide_url_passwords(cleansed, self.cleansed_substitute)
        if isinstance(cleansed, bytes | bytearray):
            hidden = hide_bytes_url_passwords(bytes(cleansed), self.cleansed_substitute)
            return bytearray(hidden) if isinstance(cleansed, bytearray) else hidden
        if isinstance(cleansed, set | frozenset):
            return self._cleanse_set(cleansed)
        if isinstance(value, dict) and isinstance(cleansed, dict):  # its values walked, not its keys
            return self._cleanse_keys(cleansed)
        return cleansed

    def _cleanse_set(self, value: set[Any] | frozenset[Any]) -> Any:
        """A set of the cleansed items (two URLs differing only in the password become one)."""
        try:
            items = [self.cleanse_setting("", item) for item in value]
            return frozenset(items) if isinstance(value, frozenset) else set(items)
        except Exception:  # noqa: BLE001 - an item cleansed into something unhashable
            return self.cleansed_substitute

    def _cleanse_keys(self, value: dict[Any, Any]) -> Any:
        """``value`` with its keys cleansed as items of a list are (a later key that becomes
        equal to an earlier one, a URL differing only in the password, takes its place)."""
        if not any(type(key) in _KEYS for key in value):
            return value
        try:
            return {
                self.cleanse_setting("", key) if type(key) in _KEYS else key: item
                for key, item in value.items()
            }
        except Exception:  # noqa: BLE001 - a key cleansed into something unhashable
            return self.cleansed_substitute

    def cleanse_special_types(self, request: HttpRequest | None, value: Any) -> Any:
        value = super().cleanse_special_types(request, value)
        if type(value) in _PARSED:
            return value._replace(netloc=hide_netloc_password(value.netloc, self.cleansed_substitute))
        if type(value) in _PLAIN:
            # Walked as a setting's value is: strings, and keys named like a secret.
            try:
                return self.cleanse_setting("", value)
            except Exception:  # noqa: BLE001 - an error here would lose the whole report
                # A list holding itself or JSON nested deeper than the recursion limit
                # (RecursionError), a dict another thread changes (RuntimeError): Django's
                # own report shows such a value; this walk cannot, so it hides it whole.
                return self.cleansed_substitute
        return value

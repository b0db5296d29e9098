"""A local Airtable emulator: real HTTP on loopback, records in memory, injectable faults.

It speaks the part of Airtable's REST API the helpers use, at ``/v0/<base>/<table>``:

* ``GET`` (and ``POST .../listRecords``) lists records, with ``filterByFormula``,
  ``fields[]``, ``sort[n][field|direction]``, ``maxRecords``, ``pageSize`` and ``offset``;
* ``POST`` creates one record (``{"fields": ...}``) or several (``{"records": [...]}``);
* ``PATCH``/``PUT`` update one record (``.../<record id>``) or several (``{"records": [...]}``).

``filterByFormula`` is parsed, not evaluated as code: the grammar is what pyairtable
generates for equality matches — ``{Field}=<literal>`` comparisons, optionally inside
``AND(...)``/``OR(...)`` — where a literal is a quoted string (backslash escapes), a
number, ``TRUE()`` or ``FALSE()``. A string literal is only ever a value, whatever it
contains. Any other formula is answered the way Airtable answers an invalid one: 422
``INVALID_FILTER_BY_FORMULA``.

Faults are queued with :meth:`AirtableEmulator.fail` (an HTTP error status, optionally
with ``Retry-After`` or ``Location``, optionally after letting ``after`` requests through),
:meth:`~AirtableEmulator.reset_connection` (a TCP reset after the
request was read, optionally after it was carried out — the lost-response case),
:meth:`~AirtableEmulator.stall` (no answer for a while), :meth:`~AirtableEmulator.drip`
(the answer a byte at a time: each wait on the socket is short, the whole answer slow) and
:meth:`~AirtableEmulator.answer` (HTTP 200 with a body of a shape Airtable does not
send). Each fault matches a method and/or table and lasts ``times`` requests.
``AirtableEmulator(listening=False)`` binds its port without listening, so connections
are refused until :meth:`start_listening`; ``keep_alive=True`` answers in HTTP/1.1 and
keeps connections open between requests, as Airtable does.

Every request is recorded (:attr:`AirtableEmulator.requests`), faulted ones included,
so tests count attempts.
"""

from __future__ import annotations

import itertools
import json
import random
import re
import socket
import string
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

API_KEY = "patTestEmulatorKey"
DEFAULT_PAGE_SIZE = 100


class FormulaError(ValueError):
    """The formula is not one the emulator (or pyairtable's equality match) produces."""


@dataclass
class RecordedRequest:
    method: str
    base: str
    table: str
    record_id: str | None
    query: dict[str, list[str]]
    body: Any
    fault: str | None = None
    #: When the request was read (``time.monotonic()``, the tests' own clock: same process).
    received_at: float = 0.0
    #: A dripped answer: bytes of its slow part sent, and whether the client went away
    #: before it was whole. The drip's own pace is the clock: a loaded machine slows it as
    #: it slows the client, so "gave up after n bytes" holds under load where seconds do not.
    dripped: int = 0
    abandoned: bool = False

    @property
    def formula(self) -> str | None:
        if isinstance(self.body, dict) and "filterByFormula" in self.body:
            return self.body["filterByFormula"]
        values = self.query.get("filterByFormula")
        return values[0] if values else None

    @property
    def is_write(self) -> bool:
        return self.method in ("POST", "PATCH", "PUT", "DELETE") and self.record_id != "listRecords"


@dataclass
class Fault:
    kind: str  # "status", "reset", "stall", "drip", "answer"
    times: int
    method: str | None = None
    table: str | None = None
    status: int = 0
    error_type: str | None = None
    message: str | None = None
    retry_after: str | None = None
    after_processing: bool = False
    seconds: float = 0.0
    body: bytes = b""
    location: str | None = None
    after: int = 0  # matching requests let through before the fault starts
    part: str = "body"  # what a drip sends slowly: "headers" (status line included) or "body"
    size: int = 0  # a dripped body is padded with JSON whitespace to at least this many bytes

    def matches(self, method: str, table: str) -> bool:
        return (
            self.times > 0
            and (self.method is None or self.method == method)
            and (self.table is None or self.table == table)
        )


@dataclass
class Table:
    records: dict[str, dict[str, Any]] = field(default_factory=dict)


# --- the filterByFormula parser ------------------------------------------------------

Predicate = Callable[[dict[str, Any]], bool]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class _FormulaParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def parse(self) -> Any:
        """The formula as a tree: ``("eq", field, value)``, ``("and"|"or", [nodes])``."""
        node = self._expression()
        self._skip_space()
        if self.pos != len(self.text):
            raise FormulaError(f"unexpected text at position {self.pos}")
        return node

    def _skip_space(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def _peek(self, token: str) -> bool:
        self._skip_space()
        return self.text.startswith(token, self.pos)

    def _expect(self, token: str) -> None:
        if not self._peek(token):
            raise FormulaError(f"expected {token!r} at position {self.pos}")
        self.pos += len(token)

    def _expression(self) -> Any:
        for name in ("AND", "OR"):
            if self._peek(name + "("):
                self.pos += len(name) + 1
                parts = [self._expression()]
                while self._peek(","):
                    self.pos += 1
                    parts.append(self._expression())
                self._expect(")")
                return (name.lower(), parts)
        field_name = self._field()
        self._expect("=")
        return ("eq", field_name, self._literal())

    def _field(self) -> str:
        self._expect("{")
        chars: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "\\" and self.text.startswith("}", self.pos + 1):
                chars.append("}")
                self.pos += 2
            elif char == "}":
                self.pos += 1
                return "".join(chars)
            else:
                chars.append(char)
                self.pos += 1
        raise FormulaError("unterminated field name")

    def _literal(self) -> Any:
        self._skip_space()
        if self._peek("TRUE()"):
            self.pos += len("TRUE()")
            return True
        if self._peek("FALSE()"):
            self.pos += len("FALSE()")
            return False
        if self._peek("'") or self._peek('"'):
            return self._string()
        number = _NUMBER.match(self.text, self.pos)
        if number:
            self.pos = number.end()
            text = number.group()
            return float(text) if "." in text else int(text)
        raise FormulaError(f"expected a literal at position {self.pos}")

    def _string(self) -> str:
        quote = self.text[self.pos]
        self.pos += 1
        chars: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == "\\" and self.pos + 1 < len(self.text):
                chars.append(self.text[self.pos + 1])
                self.pos += 2
            elif char == quote:
                self.pos += 1
                return "".join(chars)
            else:
                chars.append(char)
                self.pos += 1
        raise FormulaError("unterminated string")


def parse_formula(text: str) -> Any:
    return _FormulaParser(text).parse()


def _cell_equals(cell: Any, value: Any) -> bool:
    if isinstance(value, bool):
        return bool(cell) == value
    if isinstance(value, int | float):
        return isinstance(cell, int | float) and not isinstance(cell, bool) and cell == value
    if cell is None:
        return value == ""
    if isinstance(cell, list):
        return ", ".join(map(str, cell)) == value
    if isinstance(cell, bool):
        return False
    return str(cell) == value


def _evaluate(node: Any, fields: dict[str, Any]) -> bool:
    if node[0] == "eq":
        return _cell_equals(fields.get(node[1]), node[2])
    results = (_evaluate(part, fields) for part in node[1])
    return all(results) if node[0] == "and" else any(results)


# --- the server ------------------------------------------------------------------------


class _Abort(Exception):
    """The handler already dealt with the connection (reset it): send nothing."""


class AirtableEmulator:
    def __init__(self, *, listening: bool = True, api_key: str = API_KEY, keep_alive: bool = False) -> None:
        self.api_key = api_key
        self.keep_alive = keep_alive
        #: How many TCP connections clients opened (a kept-alive one counts once).
        self.connections = 0
        self.page_size = DEFAULT_PAGE_SIZE
        self.requests: list[RecordedRequest] = []
        self._tables: dict[tuple[str, str], Table] = {}
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._offsets = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class(), bind_and_activate=False)
        self._server.daemon_threads = True
        self._server.server_bind()
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None
        if listening:
            self.start_listening()

    # -- life cycle --

    def start_listening(self) -> None:
        self._server.server_activate()
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.02,), name="airtable-emulator", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    # -- data --

    def add(self, base: str, table: str, fields: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            return self._create(base, table, fields)

    def records(self, base: str, table: str) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(json.dumps(r)) for r in self._table(base, table).records.values()]

    # -- faults --

    def fail(
        self,
        status: int,
        *,
        times: int = 1,
        method: str | None = None,
        table: str | None = None,
        error_type: str | None = None,
        message: str | None = None,
        retry_after: str | int | None = None,
        location: str | None = None,
        after: int = 0,
        after_processing: bool = False,
    ) -> None:
        """Answer ``status`` (with ``Location`` when given: a redirect), after letting
        ``after`` matching requests through: ``after=1`` fails the second chunk of a batch.
        With ``after_processing`` the request is carried out first, as behind a gateway
        that timed out on Airtable's answer (a 504) or lost it (a 502)."""
        self._add_fault(
            Fault(
                "status",
                times,
                method,
                table,
                status=status,
                error_type=error_type or _DEFAULT_ERROR_TYPES.get(status, "SERVER_ERROR"),
                message=message,
                retry_after=None if retry_after is None else str(retry_after),
                location=location,
                after=after,
                after_processing=after_processing,
            )
        )

    def reset_connection(
        self,
        *,
        times: int = 1,
        method: str | None = None,
        table: str | None = None,
        after_processing: bool = False,
    ) -> None:
        """Read the request, then reset the TCP connection instead of answering. With
        ``after_processing`` the request is carried out first: only the answer is lost."""
        self._add_fault(Fault("reset", times, method, table, after_processing=after_processing))

    def stall(
        self, seconds: float, *, times: int = 1, method: str | None = None, table: str | None = None
    ) -> None:
        """Carry out the request, then wait ``seconds`` before answering."""
        self._add_fault(Fault("stall", times, method, table, seconds=seconds))

    def drip(
        self,
        every: float,
        *,
        part: str = "body",
        size: int = 200,
        times: int = 1,
        method: str | None = None,
        table: str | None = None,
    ) -> None:
        """Carry out the request, then send the answer's ``part`` ("headers" or "body") one
        byte every ``every`` seconds, the body padded to ``size`` bytes: no wait on the
        socket is longer than ``every``, the answer takes about ``size`` (or its headers'
        length) times ``every``."""
        assert part in ("headers", "body")
        self._add_fault(Fault("drip", times, method, table, seconds=every, part=part, size=size))

    def answer(
        self, body: Any, *, times: int = 1, method: str | None = None, table: str | None = None
    ) -> None:
        """Answer HTTP 200 with ``body`` (bytes as they are, anything else as JSON) instead of
        carrying out the request: an answer of a shape Airtable does not send."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self._add_fault(Fault("answer", times, method, table, body=raw))

    def _add_fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, method: str, table: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, table):
                    if fault.after > 0:
                        fault.after -= 1
                        continue
                    fault.times -= 1
                    return fault
        return None

    # -- request accounting --

    def requests_for(self, method: str | None = None, table: str | None = None) -> list[RecordedRequest]:
        with self._lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method) and (table is None or r.table == table)
            ]

    def writes(self) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.is_write]

    # -- internals --

    def _table(self, base: str, table: str) -> Table:
        return self._tables.setdefault((base, table), Table())

    def _create(self, base: str, table: str, fields: dict[str, Any]) -> dict[str, Any]:
        record_id = "rec" + "".join(random.choices(string.ascii_letters + string.digits, k=14))
        record = {
            "id": record_id,
            "createdTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
            "fields": dict(fields),
        }
        self._table(base, table).records[record_id] = record
        return json.loads(json.dumps(record))

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 keeps the connection open for the next request.
            protocol_version = "HTTP/1.1" if emulator.keep_alive else "HTTP/1.0"

            def setup(self) -> None:
                super().setup()
                with emulator._lock:
                    emulator.connections += 1

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the tests read emulator.requests instead

            def do_GET(self) -> None:
                emulator._handle(self, "GET")

            def do_POST(self) -> None:
                emulator._handle(self, "POST")

            def do_PATCH(self) -> None:
                emulator._handle(self, "PATCH")

            def do_PUT(self) -> None:
                emulator._handle(self, "PUT")

        return Handler

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(handler.path)
        segments = [unquote(s) for s in parts.path.split("/") if s]
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if len(segments) not in (3, 4) or segments[0] != "v0":
            self._send(handler, 404, {"error": "NOT_FOUND"})
            return
        base, table = segments[1], segments[2]
        record_id = segments[3] if len(segments) == 4 else None
        request = RecordedRequest(
            method, base, table, record_id, parse_qs(parts.query), body, received_at=time.monotonic()
        )
        fault = self._take_fault(method, table)
        request.fault = fault.kind if fault else None
        with self._lock:
            self.requests.append(request)
        try:
            if handler.headers.get("Authorization") != f"Bearer {self.api_key}":
                self._send(
                    handler,
                    401,
                    {"error": {"type": "AUTHENTICATION_REQUIRED", "message": "Authentication required"}},
                )
                return
            if fault is not None and fault.kind == "status":
                if fault.after_processing:
                    self._route(method, base, table, record_id, request.query, body)
                self._send_fault(handler, fault)
                return
            if fault is not None and fault.kind == "answer":
                self._send_raw(handler, 200, fault.body)
                return
            if fault is not None and fault.kind == "reset" and not fault.after_processing:
                self._reset(handler)
            status, payload = self._route(method, base, table, record_id, request.query, body)
            if fault is not None and fault.kind == "reset":
                self._reset(handler)
            if fault is not None and fault.kind == "stall":
                self._stopping.wait(fault.seconds)
            if fault is not None and fault.kind == "drip":
                self._drip(handler, status, payload, fault, request)
                return
            self._send(handler, status, payload)
        except _Abort:
            return

    def _route(
        self,
        method: str,
        base: str,
        table: str,
        record_id: str | None,
        query: dict[str, list[str]],
        body: Any,
    ) -> tuple[int, Any]:
        with self._lock:
            if method == "GET" and record_id is None:
                return self._list(base, table, _options_from_query(query))
            if method == "POST" and record_id == "listRecords":
                return self._list(base, table, body or {})
            if method == "POST" and record_id is None:
                return self._create_from_body(base, table, body)
            if method in ("PATCH", "PUT"):
                return self._update_from_body(base, table, record_id, body, replace=method == "PUT")
        return 404, {"error": "NOT_FOUND"}

    def _list(self, base: str, table: str, options: dict[str, Any]) -> tuple[int, Any]:
        records = list(self._table(base, table).records.values())
        formula = options.get("filterByFormula")
        if formula:
            try:
                tree = parse_formula(formula)
            except FormulaError:
                return 422, {
                    "error": {
                        "type": "INVALID_FILTER_BY_FORMULA",
                        "message": "The formula for filtering records is invalid",
                    }
                }
            records = [r for r in records if _evaluate(tree, r["fields"])]
        for sort in reversed(options.get("sort") or []):
            records.sort(
                key=lambda r, name=sort["field"]: (r["fields"].get(name) is None, str(r["fields"].get(name))),
                reverse=sort.get("direction") == "desc",
            )
        if options.get("maxRecords"):
            records = records[: int(options["maxRecords"])]
        start = int(options.get("offset") or 0)
        size = min(int(options.get("pageSize") or self.page_size), self.page_size)
        page = records[start : start + size]
        wanted = options.get("fields")
        result: dict[str, Any] = {
            "records": [
                {**r, "fields": {k: v for k, v in r["fields"].items() if not wanted or k in wanted}}
                for r in page
            ]
        }
        if start + size < len(records):
            result["offset"] = str(start + size)
        return 200, json.loads(json.dumps(result))

    def _create_from_body(self, base: str, table: str, body: Any) -> tuple[int, Any]:
        if isinstance(body, dict) and isinstance(body.get("fields"), dict):
            return 200, self._create(base, table, body["fields"])
        records = body.get("records") if isinstance(body, dict) else None
        if (
            isinstance(records, list)
            and len(records) <= 10
            and all(isinstance(r, dict) and isinstance(r.get("fields"), dict) for r in records)
        ):
            return 200, {"records": [self._create(base, table, r["fields"]) for r in records]}
        return 422, {"error": {"type": "INVALID_REQUEST_UNKNOWN", "message": "Invalid request"}}

    def _update_from_body(
        self, base: str, table: str, record_id: str | None, body: Any, *, replace: bool
    ) -> tuple[int, Any]:
        existing = self._table(base, table).records
        if record_id is not None:
            items = [{"id": record_id, "fields": (body or {}).get("fields")}]
        elif isinstance(body, dict) and isinstance(body.get("records"), list) and len(body["records"]) <= 10:
            items = body["records"]
        else:
            return 422, {"error": {"type": "INVALID_REQUEST_UNKNOWN", "message": "Invalid request"}}
        if not all(isinstance(i, dict) and isinstance(i.get("fields"), dict) for i in items):
            return 422, {"error": {"type": "INVALID_REQUEST_UNKNOWN", "message": "Invalid request"}}
        if any(i.get("id") not in existing for i in items):
            return 404, {"error": {"type": "NOT_FOUND", "message": "Could not find a record"}}
        updated = []
        for item in items:
            record = existing[item["id"]]
            record["fields"] = dict(item["fields"]) if replace else {**record["fields"], **item["fields"]}
            updated.append(json.loads(json.dumps(record)))
        return 200, (updated[0] if record_id is not None else {"records": updated})

    def _send_fault(self, handler: BaseHTTPRequestHandler, fault: Fault) -> None:
        headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
        if fault.location is not None:
            headers["Location"] = fault.location
        error: dict[str, Any] = {"type": fault.error_type}
        if fault.message is not None:
            error["message"] = fault.message
        self._send(handler, fault.status, {"error": error}, headers)

    @classmethod
    def _send(
        cls, handler: BaseHTTPRequestHandler, status: int, payload: Any, headers: dict[str, str] | None = None
    ) -> None:
        cls._send_raw(handler, status, json.dumps(payload).encode(), headers)

    @staticmethod
    def _send_raw(
        handler: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str] | None = None
    ) -> None:
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:
            pass  # the client went away (it timed out): nothing to answer

    def _drip(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        payload: Any,
        fault: Fault,
        request: RecordedRequest,
    ) -> None:
        data = json.dumps(payload).encode()
        data += b" " * max(fault.size - len(data), 0)
        head = (
            f"{handler.protocol_version} {status} {handler.responses[status][0]}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        ).encode()
        before, slow, after = (b"", head, data) if fault.part == "headers" else (head, data, b"")
        handler.close_connection = True  # whatever the client makes of the answer
        try:
            handler.wfile.write(before)
            for byte in slow:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                request.dripped += 1
                if self._stopping.wait(fault.seconds):
                    return
            handler.wfile.write(after)
        except OSError:
            request.abandoned = True  # the client went away (it gave up): nothing more to send

    @staticmethod
    def _reset(handler: BaseHTTPRequestHandler) -> None:
        # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
        # The socket is really closed only once its makefile() reader is closed too.
        connection: socket.socket = handler.connection
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        handler.rfile.close()
        connection.close()
        handler.close_connection = True
        raise _Abort


_DEFAULT_ERROR_TYPES = {
    401: "AUTHENTICATION_REQUIRED",
    403: "INVALID_PERMISSIONS_OR_MODEL_NOT_FOUND",
    404: "NOT_FOUND",
    413: "REQUEST_TOO_LARGE",
    422: "INVALID_VALUE_FOR_COLUMN",
    429: "RATE_LIMIT_REACHED",
    500: "SERVER_ERROR",
    502: "BAD_GATEWAY",
    503: "SERVICE_UNAVAILABLE",
    504: "GATEWAY_TIMEOUT",
}


def _options_from_query(query: dict[str, list[str]]) -> dict[str, Any]:
    options: dict[str, Any] = {key: values[0] for key, values in query.items() if values}
    options["fields"] = query.get("fields[]")
    sorts: dict[int, dict[str, str]] = {}
    for key, values in query.items():
        match = re.fullmatch(r"sort\[(\d+)\]\[(field|direction)\]", key)
        if match:
            sorts.setdefault(int(match.group(1)), {})[match.group(2)] = values[0]
    options["sort"] = [sorts[i] for i in sorted(sorts)]
    return options

"""The package's shape: no import cycles, and no module or function longer than the team's
limits unless the allow-list below says why (read from the source with ``ast``)."""

from __future__ import annotations

import importlib

import pytest

from tests.structure import cycles, functions, import_graph, module_files

MODULE_LINES = 400
FUNCTION_LINES = 60

#: Modules allowed over MODULE_LINES, with the reason.
LONG_MODULES = {
    "nexus_workflows.deferred.transitions": "the state machine: every transition of a row in one module",
    "nexus_workflows.deferred.runner.loop": "the Runner: its loop, and where its parts are wired together",
    "nexus_workflows.flow.claiming": "flow control's claims: slots, keys and rate windows in one claim",
    "nexus_workflows.phi.recognizers": "mostly data: one recognizer table per category of identifier",
    "nexus_workflows.admin": "one ModelAdmin: its columns, detail fields, actions and buttons",
    "nexus_workflows.phi.service": "encode/decode and the token writer (its SQL is in nexus_workflows.sql)",
}

#: Functions allowed over FUNCTION_LINES ("module:qualname"), with the reason.
LONG_FUNCTIONS = {
    "nexus_workflows.airtable.checks:check_airtable_settings": "a flat list of independent setting checks",
    "nexus_workflows.phi.keys:key_problems": "a flat list of independent key checks, each with its hint",
    "nexus_workflows.deferred.enqueue:_settle_chunk": "one batch's insert, dedupe and revive in one atomic",
    "nexus_workflows.deferred.enqueue:_enqueue_deferred": "the dedupe rounds of one enqueue in one loop",
    "nexus_workflows.phi.service:_Writer.allocate": "the allocation's retry loop around one statement",
}


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(module_files()))
def test_every_module_imports(name: str) -> None:
    assert importlib.import_module(name).__name__ == name


def test_modules_are_short_or_say_why() -> None:
    long = {
        name for name, path in module_files().items() if len(path.read_text().splitlines()) > MODULE_LINES
    }
    assert long == long & set(LONG_MODULES), (
        f"over {MODULE_LINES} lines without a reason: {long - set(LONG_MODULES)}"
    )
    assert set(LONG_MODULES) <= long, f"no longer long, drop from LONG_MODULES: {set(LONG_MODULES) - long}"


def test_functions_are_short_or_say_why() -> None:
    long = {
        f"{name}:{function.qualname}"
        for name, path in module_files().items()
        for function in functions(path)
        if function.lines > FUNCTION_LINES
    }
    unexplained = long - set(LONG_FUNCTIONS)
    assert not unexplained, f"over {FUNCTION_LINES} lines without a reason: {sorted(unexplained)}"
    stale = set(LONG_FUNCTIONS) - long
    assert not stale, f"no longer long, drop from LONG_FUNCTIONS: {sorted(stale)}"

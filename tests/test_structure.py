"""The package's shape: no import cycles, and no module or function longer than the team's
limits unless the allow-list below says why (read from the source with ``ast``)."""

from __future__ import annotations

import importlib

import pytest

from tests.structure import cycles, functions, import_graph, module_files, module_reason

MODULE_LINES = 400
FUNCTION_LINES = 60


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]


@pytest.mark.parametrize("name", sorted(module_files()))
def test_every_module_imports(name: str) -> None:
    assert importlib.import_module(name).__name__ == name


def test_modules_are_short_or_say_why() -> None:
    """A module over MODULE_LINES says why in a top-level "# Long module: ..." line; a
    module that says so is long."""
    for name, path in module_files().items():
        long, reason = len(path.read_text().splitlines()) > MODULE_LINES, module_reason(path)
        assert long <= bool(reason), f"{name}: over {MODULE_LINES} lines without a reason"
        assert bool(reason) <= long, f"{name}: no longer long; drop its '# Long module' line"


def test_functions_are_short_or_say_why() -> None:
    """A function over FUNCTION_LINES says why in a "# Long function: ..." comment of its
    own body; a function that says so is long."""
    for name, path in module_files().items():
        for function in functions(path):
            where = f"{name}:{function.qualname}"
            long = function.lines > FUNCTION_LINES
            assert long <= bool(function.reason), f"{where}: over {FUNCTION_LINES} lines without a reason"
            assert bool(function.reason) <= long, f"{where}: no longer long; drop its '# Long function' line"

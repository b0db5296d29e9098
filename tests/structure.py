"""The package's shape, read from its source with ``ast``: which modules import which
(every import, at module level or inside a function; not ``if TYPE_CHECKING:`` blocks),
and how long modules and functions are."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "nexus_workflows"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def module_files() -> dict[str, Path]:
    """Every module of the package (migrations left out: Django writes them), by dotted name."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT.parent).with_suffix("")
        if "migrations" in relative.parts:
            continue
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for child in node.orelse for n in _imports(child))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # "from package import module" imports the module; "from module import name" the module.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            ]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(groups)


@dataclass(frozen=True)
class Function:
    qualname: str
    lines: int
    # The reason it may be long, from a "# Long function: ..." comment in its body.
    reason: str | None = None


LONG_MODULE = re.compile(r"^# Long module: (?P<reason>\S.*)$", re.M)
LONG_FUNCTION = re.compile(r"^\s*# Long function: (?P<reason>\S.*)$")


def module_reason(path: Path) -> str | None:
    """The reason a module gives for being long: a top-level "# Long module: ..." line."""
    match = LONG_MODULE.search(path.read_text())
    return match["reason"] if match else None


def functions(path: Path) -> Iterator[Function]:
    """Every function and method of a module with its length in lines (decorators and
    docstring included)."""

    source = path.read_text().splitlines()

    def reason(first: int, last: int) -> str | None:
        for line in source[first - 1 : last]:
            match = LONG_FUNCTION.match(line)
            if match:
                return match["reason"]
        return None

    def walk(node: ast.AST, prefix: str) -> Iterator[Function]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                qualname = f"{prefix}{child.name}"
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                last = child.end_lineno or child.lineno
                # The reason belongs to the function's own lines before any nested function.
                nested = [
                    inner.lineno
                    for inner in ast.walk(child)
                    if inner is not child and isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                yield Function(qualname, last - first + 1, reason(first, min([last, *nested])))
                yield from walk(child, f"{qualname}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")

    yield from walk(ast.parse(path.read_text(), str(path)), "")

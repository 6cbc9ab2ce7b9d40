"""The import rules of docs/architecture.md, checked on the source.

Floors, bottom up: storage → collectors → analytics → slo_rules → dashboards → demo → bench →
tailwatch. A package imports only from the floors below it (nothing imports tailwatch), only
through the other package's ``__init__`` and only names in its ``__all__`` (so never a private
one; bench/, which times stages from inside, is exempt from that one), and no module reaches
itself through a chain of imports, not even inside a function.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("storage", "collectors", "analytics", "slo_rules", "dashboards", "demo", "bench", "tailwatch")
# A surface a reader takes in at a glance: one screen of names.
MAX_PUBLIC_NAMES = 30


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    importer: str  # module name
    module: str  # imported module
    names: tuple[str, ...]  # for `from module import names`; () for `import module`


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> Iterator[Import]:
    for package in FLOORS:
        for path in sorted((ROOT / package).rglob("*.py")):
            importer = _module_name(path)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    if node.module.split(".")[0] in FLOORS:
                        yield Import(
                            path, node.lineno, importer, node.module, tuple(a.name for a in node.names)
                        )
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] in FLOORS:
                            yield Import(path, node.lineno, importer, alias.name, ())


IMPORTS = list(_imports())


def _where(item: Import) -> str:
    return f"{item.path.relative_to(ROOT)}:{item.line}"


def test_imports_go_down_the_floors() -> None:
    wrong = [
        f"{_where(i)} {i.importer} imports {i.module} (a floor above or beside it)"
        for i in IMPORTS
        if FLOORS.index(i.module.split(".")[0]) > FLOORS.index(i.importer.split(".")[0])
    ]
    assert not wrong, "\n".join(wrong)


def test_other_packages_are_reached_through_their_public_surface() -> None:
    wrong: list[str] = []
    for i in IMPORTS:
        target = i.module.split(".")[0]
        # bench/ measures stages from inside (the decoder alone, the native insert), like tests do.
        if target == i.importer.split(".")[0] or i.importer.startswith("bench."):
            continue
        if i.module != target:
            wrong.append(f"{_where(i)} imports {i.module}: use `from {target} import ...`")
            continue
        public = set(importlib.import_module(target).__all__)
        hidden = [name for name in i.names if name not in public]
        if hidden:
            wrong.append(f"{_where(i)} imports {', '.join(hidden)}, not in {target}.__all__")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", [*FLOORS[:-3], "demo"])
def test_each_stage_surface_fits_on_a_screen(package: str) -> None:
    public = importlib.import_module(package).__all__
    assert len(public) <= MAX_PUBLIC_NAMES, f"{package}.__all__ has {len(public)} names"
    assert not [name for name in public if name.startswith("_")]
    module = importlib.import_module(package)
    assert [name for name in public if not hasattr(module, name)] == []


def test_no_import_cycles() -> None:
    modules = {_module_name(p) for package in FLOORS for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in IMPORTS:
        targets = {i.module} | {f"{i.module}.{name}" for name in i.names}
        # A submodule importing its own package's __init__ is how Python loads it, not a cycle.
        graph[i.importer] |= {t for t in targets & modules if not i.importer.startswith(t + ".")}

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" ↔ ".join(c) for c in cycles)


def test_only_the_wiring_reads_tailwatch_settings_from_the_environment() -> None:
    # Every TAILWATCH_* variable is declared once, in tailwatch/config.py; stages take arguments.
    readers = [
        f"{path.relative_to(ROOT)}"
        for package in FLOORS[:-1]
        for path in (ROOT / package).rglob("*.py")
        if "os.environ" in (text := path.read_text(encoding="utf-8")) and '"TAILWATCH_' in text
    ]
    assert not readers, f"stages reading TAILWATCH_* variables: {readers}"

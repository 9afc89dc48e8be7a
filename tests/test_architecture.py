"""The shape of the code (docs/architecture.md): the import graph of ``minimodel`` has no cycles, no module grows
past the size a reader takes in at once, the config schema imports nothing of minimodel, and only systems.py
knows system names."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "minimodel"
MAX_LINES = 450


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """Every module of ``known`` that ``path`` imports, wherever the import sits (top level, a function, a
    TYPE_CHECKING block): ``from minimodel.x import y`` counts ``minimodel.x.y`` when that is a module, else
    ``minimodel.x``; relative imports are resolved against the importing module."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    found.add(sub)
                elif base in known:
                    found.add(base)
    return found - {me}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, set(mods)) for name, path in mods.items()}


def test_the_cycle_finder_finds_a_planted_cycle():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(g) == [["a", "b", "c"], ["e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycles():
    g = graph()
    assert len(g) > 50 and sum(len(v) for v in g.values()) > 150  # the scan sees the package
    assert "minimodel.store.layout" in g["minimodel.systems"]
    assert cycles(g) == []


def test_function_level_and_relative_imports_are_edges(tmp_path):
    pkg = tmp_path / "minimodel"
    pkg.mkdir()
    (pkg / "m.py").write_text("def f():\n    from minimodel.store.layout import Layout\n    from . import systems\n")
    known = {"minimodel.store.layout", "minimodel.systems", "minimodel.m"}
    assert imports_of(pkg / "m.py", known, tmp_path) == {"minimodel.store.layout", "minimodel.systems"}


def test_no_module_is_over_the_size_limit():
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}


def test_the_config_schema_imports_nothing_of_minimodel():
    mods = modules()
    assert imports_of(mods["minimodel.config.schema"], set(mods)) == set()


SYSTEM_NAMES = {"bl_base", "bl_small", "minijoint", "minipost"}


def compared_outside(names: set, owner: str) -> list[str]:
    """Every comparison with one of ``names`` (a constant in an ``==``, ``in``, ...) in a module other than ``owner``."""
    offenders = []
    for name, path in modules().items():
        if name == owner:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                constants = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                if constants & names:
                    offenders.append(f"{name}:{node.lineno}")
    return offenders


def test_only_systems_branches_on_a_system_name():
    """No comparison with a system's name (`system == "minipost"`, `in ("bl_base", ...)`) outside the declarations
    in systems.py: what differs between systems is declared there."""
    assert compared_outside(SYSTEM_NAMES, "minimodel.systems") == []


def test_only_families_branches_on_a_family_name():
    """No comparison with a model family's name (`family == "decoder"`) outside the declarations in families.py: what
    differs between families (objective, pooling, output bias, positions, Hugging Face module) is declared there."""
    from minimodel.models.families import REGISTRY

    assert compared_outside(set(REGISTRY), "minimodel.models.families") == []

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
    assert imports_of(mods["minimodel.config.schema"], set(mods)) == {"minimodel.config.model_schema"}
    assert imports_of(mods["minimodel.config.model_schema"], set(mods)) == set()


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


# The top level of minimodel/: the entry points (cli, and what it runs: experiment loading, the pipeline, export),
# the declarations of the systems, and the few small modules every package uses. Everything else lives in a package
# that names its part of the architecture (docs/architecture.md).
TOP_LEVEL = {"cli", "experiment", "pipeline", "export", "systems", "errors", "log", "signals", "flops", "metrics",
             "task_metrics"}
PACKAGES = {"config", "data", "models", "store", "cluster", "training", "stages", "report"}


def test_the_top_level_holds_only_the_entry_points_and_the_shared_modules():
    assert {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"} == TOP_LEVEL
    assert {p.parent.name for p in PACKAGE.glob("*/__init__.py")} == PACKAGES
    assert not [p for p in PACKAGE.glob("*/*/__init__.py")]  # one level of packages


# What other code may take from systems.py: the declarations and the one resolved plan per stage.
SYSTEMS_API = {"Body", "System", "Phase", "Runs", "StagePlan", "STAGES", "REGISTRY", "ORDER", "REFERENCE", "FORMULAS",
               "get", "validate", "stage_plan"}


def plan_offenders(paths: list[Path]) -> list[str]:
    """Every place in ``paths`` that builds a ``StagePlan`` itself, or takes from systems.py anything but
    ``SYSTEMS_API`` (``from minimodel.systems import x``, ``systems.x``): the questions a plan answers are asked of
    systems.py once, through ``stage_plan``."""
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.name}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.module == "minimodel.systems":
                out += [f"{where} imports {a.name}" for a in node.names if a.name not in SYSTEMS_API]
            elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "systems"
                  and node.attr not in SYSTEMS_API):
                out.append(f"{where} uses systems.{node.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "StagePlan":
                out.append(f"{where} builds a StagePlan")
    return sorted(out, key=lambda s: (s.split(":")[0], int(s.split(":")[1].split()[0])))


def test_only_systems_builds_a_plan():
    """Stages, the memory plan and its probe, finetuning, the cost table and the command line take a ``StagePlan``
    (``systems.stage_plan``) instead of asking systems.py one question at a time; only systems.py builds one, and
    its public functions are the API above (a new per-configuration question is a field of the plan)."""
    from minimodel import systems

    others = [p for name, p in modules().items() if name != "minimodel.systems"]
    scripts = [*sorted((ROOT / "tests").glob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py")),
               *sorted((ROOT / "scripts").glob("*.py"))]
    assert plan_offenders([*others, *[p for p in scripts if p.name != "test_architecture.py"]]) == []
    public = {n for n, v in vars(systems).items() if not n.startswith("_") and getattr(v, "__module__", "") == systems.__name__}
    assert public <= SYSTEMS_API and {"stage_plan", "StagePlan"} <= public, public - SYSTEMS_API


def test_the_plan_checker_finds_planted_questions(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from minimodel.systems import Body, adapt_depth\nfrom minimodel import systems\n"
                   "d = systems.adapt_phases(cfg)\np = StagePlan(stage='adapt')\n")
    assert plan_offenders([bad]) == ["bad.py:1 imports adapt_depth", "bad.py:3 uses systems.adapt_phases",
                                     "bad.py:4 builds a StagePlan"]


def test_a_stage_plan_answers_each_stage():
    """The plan's fields for the paper's four systems, against the values the functions it replaced gave."""
    from minimodel.config.schema import PRIMARY
    from minimodel.experiment import load_experiment
    from minimodel.systems import Body, Phase, stage_plan

    exp = ROOT / "experiments" / "tiny.yaml"
    joint = load_experiment(exp, ["system=minijoint", "lang=de"])
    plan = stage_plan(joint, "adapt")
    depth = joint.model.mini_heads[0]
    assert (plan.body, plan.head, plan.depth, plan.layers, plan.formula) == (Body.HEAD, f"l{depth}", depth, depth, "A3")
    assert plan.phases == (Phase(f"l{depth}", depth, 0, joint.adapt.optim.updates),)
    assert plan.reads == (plan.runs.pretrain,) and plan.writes == plan.runs.adapt("de")
    assert plan.bodies == ("primary", "mini") and plan.tokenizer == "" and plan.runs_here
    pre = stage_plan(joint, "pretrain")
    assert (pre.layers, pre.formula, pre.reads, pre.writes) == (joint.model.layers, "A1", (), plan.runs.pretrain)

    post = load_experiment(exp, ["system=minipost", "model.mini_heads=[]", "bridge.depth=2", "lang=de"])
    bridge, adapt = stage_plan(post, "bridge"), stage_plan(post, "adapt")
    assert bridge.runs_here and (bridge.layers, bridge.formula) == (post.bridge.depth + post.bridge.layers, "A4")
    assert bridge.reads == (bridge.runs.pretrain,) and bridge.writes == bridge.runs.bridge
    assert bridge.runs.pretrain.parent.name == "bl_base"  # MiniPost bridges from BL_BASE's step 1
    assert adapt.body is Body.BRIDGE and adapt.reads == (adapt.runs.bridge,) and adapt.depth == bridge.layers
    assert not stage_plan(post, "pretrain").runs_here and stage_plan(post, "pretrain").writes is None

    base = load_experiment(exp, ["system=bl_base", "model.mini_heads=[]"])
    plan = stage_plan(base, "finetune")
    assert (plan.body, plan.head, plan.depth, plan.bodies) == (Body.OWN, PRIMARY, base.model.layers, ("primary",))
    assert plan.reads == (plan.runs.pretrain,) and plan.formula == "" and not stage_plan(base, "bridge").runs_here
    try:
        stage_plan(base, "distill")
    except ValueError as e:
        assert "unknown stage 'distill'" in str(e)
    else:
        raise AssertionError("an unknown stage was planned")

"""The README and docs/ (issue 28): a short README that starts with the two commands a newcomer needs and maps
every docs page; every relative link resolves to a file and an anchor; every section that left the README is on
the page its map names; and what the pages tell a user to type exists: make targets, `minimodel` commands and
their options, config keys, the own-task walkthrough's experiment file."""

from __future__ import annotations

import re
import shlex
import unicodedata
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from minimodel.cli import build_parser
from minimodel.config.schema import ExperimentConfig, TaskConfig
from minimodel.experiment import load_experiment
from tests.conftest import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
ALL = [README, *PAGES]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (a link or a heading in a code block is not one)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text(encoding="utf-8")))


def commands(path: Path) -> list[str]:
    """What a page tells a user to type: every line of a fenced block and every code span, from the command on
    (a block's ``$ `` prompt and a span's surrounding prose left out)."""
    text = path.read_text(encoding="utf-8")
    lines = [line.strip().removeprefix("$ ") for m in FENCE.finditer(text) for line in m.group(0).splitlines()[1:-1]]
    spans = re.findall(r"`([^`\n]+)`", FENCE.sub("", text))
    out = []
    for line in lines + spans:  # `make study && make study-beyond`: two commands
        out += [part.strip() for part in line.split(" #")[0].split("&&")]
    return out


# ---------------------------------------------------------------------------------------------- the README


def test_the_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 100, f"README.md has {n} lines: move detail into a docs/ page and link it from the README's map"


def test_the_readmes_prose_lines_are_short():
    """Issue 55 part 7: no line over 200 characters outside code blocks and tables (measurements live in docs/)."""
    long = [line[:60] for line in prose(README.read_text(encoding="utf-8")).splitlines()
            if len(line) > 200 and not line.startswith("|")]
    assert not long, f"README.md lines over 200 characters outside code and tables: {long}"


GENERATED = "# Mini-model adaptation:"  # the title `minimodel report` gives a report


@pytest.mark.parametrize("page", sorted(DOCS.rglob("*.md")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_opens_by_saying_what_it_is_for(page: Path):
    """Issue 55 part 7: after the title, a page starts with a sentence or two of prose (not code, a table, a list or
    another heading) saying what it is for; a generated report opens with its systems and tasks instead."""
    lines = page.read_text(encoding="utf-8").splitlines()
    assert lines and lines[0].startswith("# "), f"{page.relative_to(ROOT)} does not start with a title"
    if lines[0].startswith(GENERATED):
        return
    first = next((line for line in lines[1:] if line.strip()), "")
    assert first and not first.startswith(("```", "|", "#", "- ", "* ", "<")), (
        f"{page.relative_to(ROOT)}: the first thing after the title is {first[:60]!r}, not a sentence saying what "
        f"the page is for")


def test_the_readme_starts_with_the_two_commands():
    """A newcomer on a fresh machine reads these first: the demo, then the tests (each installs what it needs)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# ")
    start = next(i for i, line in enumerate(lines) if line.strip())  # the title
    body = [line for line in lines[start + 1:] if line.strip()]
    assert body[0].startswith("```"), "the README's first block after the title is the commands"
    assert body[1].startswith("make demo ") and body[2].startswith("make test ") and body[3].startswith("```")
    assert "installs" in body[1] and "installs" in body[2]


def test_every_docs_page_is_linked_from_the_readme_and_exists():
    targets = {link.split("#")[0] for link in links(README)}
    linked = {t for t in targets if t.startswith("docs/") and t.endswith(".md")}
    assert linked, "the README links no docs page"
    for target in sorted(linked):
        assert (ROOT / target).is_file(), f"README.md links {target}, which does not exist"
    unlinked = [p.name for p in PAGES if f"docs/{p.name}" not in linked]
    assert not unlinked, f"docs pages the README's map does not link (one click from the README): {unlinked}"


# ---------------------------------------------------------------------------------------------- links


@pytest.mark.parametrize("page", ALL, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_anchor(page: Path):
    bad = []
    for link in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            bad.append(f"{link}: no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            bad.append(f"{link}: no heading with anchor #{anchor} in {path.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_slugs_are_githubs():
    assert slug("What `make demo` prints, and how to read it") == "what-make-demo-prints-and-how-to-read-it"
    assert slug("Beyond the paper: the extensions' rows") == "beyond-the-paper-the-extensions-rows"
    assert slug("Full disk, read-only file system, Ctrl-C") == "full-disk-read-only-file-system-ctrl-c"
    assert slug("The target: a `ModelFamily` declaration plus the model file") == (
        "the-target-a-modelfamily-declaration-plus-the-model-file")


# ---------------------------------------------------------------------------------------------- what moved where

MOVED = {
    # a section of the README before issue 28 -> the page that holds it now (its heading there)
    "Running experiments": ("running.md", "Make targets"),
    "Experiments": ("running.md", "Experiments"),
    "MiniPost from a public model": ("running.md", "MiniPost from a public model"),
    "What runs write": ("running.md", "What runs write"),
    "The report": ("running.md", "The report"),
    "Configuration": ("running.md", "Configuration"),
    "Seeds": ("running.md", "Seeds"),
    "Code: exit codes and Ctrl-C": ("running.md", "Exit codes"),
    "Code: safety and consistency": ("running.md", "Safety and consistency"),
    "Data": ("data.md", "Corpora and `minimodel prepare`"),
    "Results on wandb": ("wandb.md", "Results on wandb"),
    "Export to transformers": ("export.md", "Export to transformers"),
    "Beyond the paper": ("extensions.md", "Beyond the paper: the extensions"),
    "SLURM": ("slurm.md", "Submitting"),
    "SLURM: memory per GPU": ("slurm.md", "Memory per GPU"),
    "SLURM: try the cluster path on one machine": ("slurm.md", "Try the cluster path on one machine"),
    "Your own task": ("own-task.md", "Your own task"),
    "Tests": ("testing.md", "Tests, golden values, benchmarks, the GPU check"),
}


@pytest.mark.parametrize("section", MOVED)
def test_a_section_that_left_the_readme_is_on_its_page_and_in_the_map(section: str):
    page, heading = MOVED[section]
    assert slug(heading) in anchors(DOCS / page), f"{section!r}: no heading {heading!r} in docs/{page}"
    assert f"(docs/{page})" in README.read_text(encoding="utf-8"), f"the README's map does not link docs/{page}"


def test_what_the_demo_prints_stays_in_the_readme():
    text = README.read_text(encoding="utf-8")
    assert "what-make-demo-prints-and-how-to-read-it" in anchors(README)
    for column in ("final", "days to 95%", "speedup", "95% interval", "majority class"):
        assert f"**{column}**" in text, f"the README does not say how to read the demo's column {column!r}"


# ---------------------------------------------------------------------------------------------- against the code


def make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE)
    assert phony
    return set(phony.group(1).split())


@pytest.mark.parametrize("page", ALL, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_a_page_names_exists(page: Path):
    targets, missing = make_targets(), set()
    for command in commands(page):
        if not command.startswith("make "):
            continue
        for word in command.split()[1:]:  # `make minipost  bl_small  depth_sweep` names several
            name = word.rstrip(",.:)")
            if "=" in word or not re.fullmatch(r"[a-z][\w-]*", name):
                break
            if name not in targets:
                missing.add(name)
            if name != word:
                break
    assert not missing, f"{page.relative_to(ROOT)} names make targets the Makefile lacks: {sorted(missing)}"


def cli_options() -> dict[str, set[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {name: {o for a in p._actions for o in a.option_strings} for name, p in sub.choices.items()}


@pytest.mark.parametrize("page", ALL, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_minimodel_command_and_option_a_page_names_exists(page: Path):
    options, bad, seen = cli_options(), [], 0
    for command in commands(page):
        m = re.match(r"(?:\.venv/bin/)?minimodel (\S+)(.*)", command)
        if not m:
            continue
        seen += 1
        name, rest = m.groups()
        if name.isupper():  # `minimodel COMMAND CONFIG`: a placeholder
            continue
        if name not in options:
            bad.append(f"minimodel {name}: no such command")
            continue
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
            if flag not in options[name]:
                bad.append(f"minimodel {name} {flag}: no such option")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(sorted(set(bad)))
    if page.name in ("running.md", "export.md", "slurm.md"):
        assert seen, f"{page.relative_to(ROOT)} shows no minimodel command: has the check lost them?"


SECTIONS = ("model", "data", "pretrain", "bridge", "adapt", "finetune", "evaluate", "logging", "tasks")
CONFIG_KEY = re.compile(r"(?<![\w./{-])((?:" + "|".join(SECTIONS) + r")\.[a-z_*][\w.*]*)")


def resolves(cls: Any, parts: list[str]) -> bool:
    """Whether ``parts`` (a dotted key, ``*`` for any name) names a field of the dataclass ``cls``."""
    if not parts:
        return True
    hints = get_type_hints(cls)
    names = {f.name for f in fields(cls)}
    if parts[0] not in names:
        return False
    kind = hints[parts[0]]
    if get_origin(kind) is dict:  # tasks: {name: TaskConfig}, head_weights: {head: weight}
        value = get_args(kind)[1]
        return len(parts) <= 2 or (is_dataclass(value) and resolves(value, parts[2:]))
    if get_origin(kind) is list:  # adapt.schedule: [{head, until}]
        return len(parts) == 1
    return resolves(kind, parts[1:]) if is_dataclass(kind) else len(parts) == 1


@pytest.mark.parametrize("page", [README, *(DOCS / n for n in (
    "running.md", "data.md", "own-task.md", "extensions.md", "slurm.md", "wandb.md", "export.md", "testing.md"))],
    ids=lambda p: str(p.relative_to(ROOT)))
def test_every_config_key_a_page_names_exists(page: Path):
    """The pages that took the README's sections name config keys (`adapt.head=l4`, `data.encode_threads`):
    each must be a key of the schema (`tasks.NAME.*` a key of a task)."""
    keys = set(CONFIG_KEY.findall("\n".join(commands(page))))
    bad = []
    for key in sorted(keys):
        parts = key.rstrip(".").split(".")
        if parts[0] == "tasks":
            ok = len(parts) >= 3 and resolves(TaskConfig, parts[2:]) or len(parts) == 2
        else:
            ok = resolves(ExperimentConfig, parts)
        if not ok:
            bad.append(key)
    assert not bad, f"{page.relative_to(ROOT)} names config keys the schema lacks: {bad}"


def test_the_own_task_walkthroughs_experiment_file_loads(tmp_path: Path):
    """docs/own-task.md's experiment file, as a user pastes it next to the demo's: it loads, and reuses the demo."""
    text = (DOCS / "own-task.md").read_text(encoding="utf-8")
    m = re.search(r"cat > experiments/mytask\.yaml <<'YAML'\n(.*?)\nYAML\n", text, re.DOTALL)
    assert m, "docs/own-task.md lost its experiment file"
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    (tmp_path / "conf").symlink_to(ROOT / "conf")
    (experiments / "demo.yaml").write_text((ROOT / "experiments" / "demo.yaml").read_text(encoding="utf-8"))
    (experiments / "mytask.yaml").write_text(m.group(1) + "\n", encoding="utf-8")
    cfg = load_experiment(experiments / "mytask.yaml")
    assert cfg.name == "mytask" and cfg.models_from == "demo" and cfg.finetune.tasks == ["mytask"]
    task = cfg.tasks["mytask"]
    assert task.kind == "local" and task.text_fields == ["passage"] and task.label_field == "about_calc"
    assert task.main_metric == "macro_f1"
    commands = [shlex.split(line.split("#")[0]) for line in text.splitlines() if "make_example_task.py" in line
                and line.startswith(".venv/bin/python")]
    assert commands and commands[0][1] == "scripts/make_example_task.py" and (ROOT / commands[0][1]).is_file()


def test_the_readme_shows_what_the_demo_prints(tmp_path, capsys):
    """The summary in README's "What `make demo` prints" is the one `minimodel report` prints for the demo's
    recorded results (tests/golden/demo, which tests/test_golden.py binds to a real `make demo`): refreshing the
    golden values without the README fails here."""
    import shutil

    from minimodel.cli import main

    runs = tmp_path / "runs"
    for recorded in sorted((ROOT / "tests" / "golden" / "demo").glob("*.results.jsonl")):
        system = recorded.name.split(".")[0]
        (runs / "demo" / system).mkdir(parents=True)
        shutil.copy(recorded, runs / "demo" / system / "results.jsonl")
    assert main(["report", str(ROOT / "experiments" / "demo.yaml"), f"runs_dir={runs}",
                 f"tasks.lohelp.source={ROOT / 'data/demo/task/lohelp'}", "logging.wandb=disabled"]) == 0
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines() if not line.startswith("report: ")]
    text = README.read_text()
    block = text[text.index("## What `make demo` prints"):]
    block = block[block.index("```\n") + 4:]
    shown = [line.rstrip() for line in block[:block.index("```")].splitlines()]
    assert shown == [line for line in printed if line]

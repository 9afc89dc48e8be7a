"""`minimodel evaluate EXP` scores every system of the experiment's sweep, as `run` does, in any split (issue 55,
part 4): `evaluate.split=dev` too, unless `system=` picks one; and one of `run`'s own evaluate steps (its sweep entry
word for word) still evaluates that system alone. The stage itself is replaced by a recorder: what is checked is
which configurations the command hands it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from minimodel import cli
from minimodel.pipeline import plan
from minimodel.stages import evaluate as evaluate_stage
from tests.conftest import DEMO_CORPUS, ROOT, tiny_overrides

DEMO = str(ROOT / "experiments" / "demo.yaml")
SYSTEMS = ["bl_base", "bl_small", "minijoint", "minipost"]


@pytest.fixture()
def evaluated(monkeypatch, tmp_path):
    seen: list[tuple[str, str, str]] = []

    def record(cfg, progress=True):
        seen.append((cfg.system, cfg.evaluate.split, ",".join(cfg.target_langs)))
        return SimpleNamespace(path=Path(cfg.runs_dir) / cfg.system / "results.jsonl", stopped="")

    monkeypatch.setattr(evaluate_stage, "run_evaluate", record)
    return seen, tiny_overrides(tmp_path, DEMO_CORPUS)


@pytest.mark.parametrize("split", ["dev", "test"])
def test_evaluate_scores_every_system_of_the_sweep_in_any_split(evaluated, split):
    seen, paths = evaluated
    assert cli.main(["evaluate", DEMO, f"evaluate.split={split}", *paths, "--no-progress"]) == 0
    assert [s for s, _, _ in seen] == SYSTEMS and {x for _, x, _ in seen} == {split}


def test_system_picks_one_system_of_the_sweep(evaluated):
    seen, paths = evaluated
    assert cli.main(["evaluate", DEMO, "evaluate.split=dev", "system=minipost", "lang=de", *paths]) == 0
    assert len(seen) == 1 and seen[0][:2] == ("minipost", "dev")


def test_runs_own_evaluate_steps_each_evaluate_their_system_alone(evaluated):
    seen, paths = evaluated
    steps = [s for s in plan(DEMO, paths) if s.stage == "evaluate" and s.name.endswith("evaluate-de")]
    assert len(steps) == len(SYSTEMS)
    for step in steps:
        assert cli.main([*step.args, "--no-progress"]) == 0
    assert sorted(s for s, _, _ in seen) == sorted(SYSTEMS)

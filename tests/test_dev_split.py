"""evaluate.split=dev: step 4 on the target-language dev sets (a local task's dev.{lang}), for choosing settings
without looking at a test set; rows apart from the test rows, and a report of their own (report.dev.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from minimodel.cli import main
from minimodel.experiment import load_experiment
from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_dev_evaluation_and_report_stay_apart_from_the_test_results(tiny_finetuned, tmp_path, capsys):
    _, cfg, args = tiny_finetuned
    runs = tmp_path / "runs"
    shutil.copytree(Path(cfg.runs_dir), runs, ignore=shutil.ignore_patterns("wandb", ".lock"))
    overrides = [*args[1:], f"runs_dir={runs}"]
    results = runs / cfg.name / "bl_base" / "results.jsonl"
    test_rows = results.read_text().splitlines()

    assert main(["evaluate", args[0], *overrides, "evaluate.split=dev"]) == 0
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [json.dumps(r) for r in rows[: len(test_rows)]] == [json.dumps(json.loads(x)) for x in test_rows]
    dev = [r for r in rows[len(test_rows):] if r["step"] >= 0]
    test = [json.loads(x) for x in test_rows if json.loads(x)["step"] >= 0]
    assert dev and all(r["split"] == "dev" for r in dev)
    assert sorted((r["lang"], r["seed"], r["step"]) for r in dev) == sorted((r["lang"], r["seed"], r["step"]) for r in test)
    assert main(["evaluate", args[0], *overrides, "evaluate.split=dev"]) == 0  # nothing left to do
    assert len(results.read_text().splitlines()) == len(rows)
    preds = runs / cfg.name / "bl_base" / "predictions" / "lohelp" / "de"
    assert sorted(p.name.endswith(".dev.jsonl") for p in preds.iterdir()) == [False, False, True, True]  # 2 seeds: test, dev

    capsys.readouterr()
    assert main(["report", args[0], *overrides, "evaluate.split=dev"]) == 0
    report = (runs / cfg.name / "report.dev.md").read_text()
    assert "dev split: the target-language dev sets, for choosing settings" in report
    from collections import Counter

    from minimodel.data.tasks import TaskData

    data = TaskData("lohelp", load_experiment(args[0], [*args[1:], *overrides]).tasks["lohelp"])
    top = data.labels[Counter(int(r["label"]) for r in data.train_records()).most_common(1)[0][0]]  # of the examples used
    dev_majority = 100 * sum(json.loads(line)["label"] == top for line in
                             (ROOT / "data/demo/task/lohelp/dev.de.jsonl").read_text().splitlines()) / \
        len((ROOT / "data/demo/task/lohelp/dev.de.jsonl").read_text().splitlines())
    assert f"| majority class (train) |  | {dev_majority:.1f} |" in report  # the baseline on the dev set
    assert not (runs / cfg.name / "report.md").exists()  # the test report is another file


def test_dev_evaluation_needs_dev_sets(tiny_finetuned, capsys):
    _, cfg, args = tiny_finetuned
    assert main(["evaluate", args[0], *args[1:], "evaluate.split=dev", "finetune.tasks=[xnli]",
                 "tasks.xnli.max_len=64"]) == 2
    assert "evaluate.split=dev: task xnli has no target-language dev sets" in capsys.readouterr().err

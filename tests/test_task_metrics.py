"""Task metrics (accuracy, macro-F1, per-class F1, confusion; the main metric), the majority-class baseline of
each, and a report that cannot mislead: scores below the majority class flagged, targets met at step 0 shown as
such with an undefined speedup."""

from __future__ import annotations

import pytest
import torch

from minimodel.errors import ConfigError
from minimodel.experiment import load_experiment
from minimodel.metrics import classification_scores
from minimodel.report.curves import speedups
from minimodel.report.document import render_report, summary_text
from minimodel.report.formatting import AT_STEP0, BELOW, NO_TARGET
from minimodel.report.reading import results_from_rows
from minimodel.report.tables import table_final, table_time
from minimodel.task_metrics import majority_scores, metrics_of, scores_from_counts
from tests.conftest import ROOT

LABELS = ["no", "yes", "maybe"]
GOLD = [0, 0, 0, 0, 1, 1, 2, 0]
PRED = [0, 0, 1, 0, 1, 0, 0, 0]
ALL = ["accuracy", "macro_f1", "per_class_f1", "confusion"]


def test_macro_and_per_class_f1_equal_a_hand_computation():
    # no: tp 4, fp 2 (gold yes, maybe predicted no), fn 1 (gold no predicted yes) -> F1 = 8 / (8 + 2 + 1)
    # yes: tp 1, fp 1, fn 1 -> 2 / 4; maybe: tp 0, fp 0, fn 1 -> 0
    f1 = {"no": 100 * 8 / 11, "yes": 50.0, "maybe": 0.0}
    for scores in (scores_from_counts(GOLD, PRED, LABELS, ALL),
                   classification_scores(torch.tensor(PRED), torch.tensor(GOLD), LABELS, ALL)):
        assert scores["accuracy"] == pytest.approx(100 * 5 / 8)
        for label, v in f1.items():
            assert scores[f"f1/{label}"] == pytest.approx(v, abs=1e-4)
        assert scores["macro_f1"] == pytest.approx(sum(f1.values()) / 3, abs=1e-4)
        assert scores["confusion/no/no"] == 4 and scores["confusion/no/yes"] == 1
        assert scores["confusion/yes/no"] == 1 and scores["confusion/maybe/no"] == 1
        assert sum(v for k, v in scores.items() if k.startswith("confusion/")) == len(GOLD)


def test_macro_f1_leaves_out_a_class_neither_gold_nor_predicted():
    scores = classification_scores(torch.tensor([0, 1]), torch.tensor([0, 1]), LABELS, ["macro_f1"])
    assert scores["macro_f1"] == pytest.approx(100.0)  # 'maybe' never occurs: not a 0 in the mean
    assert scores_from_counts([0, 1], [0, 1], LABELS, ["macro_f1"])["macro_f1"] == pytest.approx(100.0)


def test_the_majority_baseline_of_every_metric():
    train = [0] * 8 + [1] * 2  # 80% 'no'
    scores = majority_scores(train, GOLD, LABELS, ALL)
    assert scores["accuracy"] == pytest.approx(100 * 5 / 8)
    assert scores["f1/no"] == pytest.approx(100 * 10 / 13)  # precision 5/8, recall 1
    assert scores["f1/yes"] == scores["f1/maybe"] == 0.0
    assert scores["macro_f1"] == pytest.approx(100 * 10 / 13 / 3)


def test_metric_defaults_and_errors(tmp_path):
    assert metrics_of(False, [], "") == (["accuracy"], "accuracy")
    assert metrics_of(False, ["per_class_f1"], "macro_f1") == (["macro_f1", "per_class_f1"], "macro_f1")
    assert metrics_of(True, [], "") == (["f1", "exact_match"], "f1")
    exp = ROOT / "experiments" / "demo.yaml"
    with pytest.raises(ConfigError, match=r"tasks.lohelp.metrics: unknown metric\(s\) \['f2'\] for a classification "
                                          r"task; valid: accuracy, macro_f1, per_class_f1, confusion"):
        load_experiment(exp, ["tasks.lohelp.metrics=[accuracy,f2]"])
    with pytest.raises(ConfigError, match=r"tasks.lohelp.main_metric='per_class_f1': the main metric of a "
                                          r"classification task is one of accuracy, macro_f1"):
        load_experiment(exp, ["tasks.lohelp.main_metric=per_class_f1"])
    with pytest.raises(ConfigError, match=r"tasks.mlqa.metrics: unknown metric\(s\) \['accuracy'\] for a qa task"):
        load_experiment(exp, ["tasks.mlqa.metrics=[accuracy]"])


# ---- the report ----------------------------------------------------------------------------------

def rows(system: str, curve: list[tuple[int, float]], lang: str = "de", seeds=(1, 2), metric: str = "accuracy"):
    return [{"system": system, "body": "primary", "task": "t", "lang": lang, "seed": seed, "step": step,
             "flops": step * 1e15, "v100_days": step * 1e-3, "split": "test", "metric": metric, "value": v + (seed - 1) * 0.2}
            for seed in seeds for step, v in curve]


def test_a_constant_predictor_below_the_majority_class_is_flagged():
    # an imbalanced task (80% one class): a system that ends at 76 looks fine until set against always-'no' (79.6)
    res = results_from_rows(rows("bl_base", [(0, 70.0), (10, 80.0)]) + rows("bl_small", [(0, 60.0), (10, 76.0)]))
    res.set_baselines({("t", "de"): {"accuracy": 79.6, "macro_f1": 44.3}})
    table = table_final(res)
    assert f"76.1 ± 0.1 {BELOW}" in table and f"80.1 ± 0.1 {BELOW}" not in table
    assert f"{BELOW} below the majority-class baseline: bl_small / t: de" in summary_text(res)
    report = render_report(res, "x", {})
    assert "Below the majority-class baseline:** bl_small / t: de" in report
    assert "| majority class (train): accuracy | 79.6 | 79.6 |" in report  # every metric of the baseline
    assert "| majority class (train): macro_f1 | 44.3 | 44.3 |" in report
    assert "| bl_small at step 0 (accuracy) | 60.1 ± 0.1 | 60.1 |" in report  # the unadapted embeddings


def test_a_target_met_at_step_0_is_shown_so_and_its_speedup_is_undefined():
    # 95% of BL_BASE's final 60 is 57: both systems are already above it before any adaptation
    res = results_from_rows(rows("bl_base", [(0, 58.0), (10, 60.0)]) + rows("minijoint", [(0, 59.0), (10, 61.0)]))
    time = table_time(res)
    assert f"| bl_base | {AT_STEP0} |" in time and f"| minijoint | {AT_STEP0} |" in time
    sp = speedups({"de": 0.0}, {"de": 0.0})
    assert sp.undefined == ("de",) and not sp.used and not sp.excluded
    report = render_report(res, "x", {})
    assert "| minijoint | undefined" in report
    # BL_BASE's own step-0 score is above its target: the target is flagged (issue 29, part 3) and left out
    assert f"{NO_TARGET} target at or below the baseline in de" in report
    assert "0×" not in report and "| minijoint | ∞" not in report
    # only the system is past the target at step 0: its speedup there is undefined
    res2 = results_from_rows(rows("bl_base", [(0, 50.0), (10, 60.0)]) + rows("minijoint", [(0, 59.0), (10, 61.0)]))
    assert "speedup undefined in de: the target is met at step 0 by one side" in render_report(res2, "x", {})
    line = next(x for x in summary_text(res).splitlines() if x.startswith("t          minijoint"))
    assert NO_TARGET in line and AT_STEP0 not in line and "undefined" in line  # a ⊘ target: "at step 0" read as success
    # a reference at step 0 and a system that needs adaptation: still no ratio (not 0)
    assert speedups({"de": 0.0}, {"de": 2.0}).undefined == ("de",)


def test_the_main_metric_drives_targets():
    data = rows("bl_base", [(0, 40.0), (10, 50.0)], metric="accuracy") + \
        rows("bl_base", [(0, 20.0), (10, 30.0)], metric="macro_f1")
    assert results_from_rows(data).final("bl_base", "t", "de").score == pytest.approx(50.1)
    res = results_from_rows(data, {"t": "macro_f1"})
    assert res.metrics == {"t": "macro_f1"} and res.final("bl_base", "t", "de").score == pytest.approx(30.1)
    assert "**t** (macro_f1)" in render_report(res, "x", {})


def test_a_report_of_several_tasks_keeps_each_tasks_baselines(tmp_path, capsys):
    """Results of two local tasks (the bundled one and docs/own-task.md's example) in one experiment: the report gives
    each its own majority-class baseline and main metric, also for a task no longer in finetune.tasks."""
    import json
    import subprocess
    import sys

    from minimodel.cli import main

    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_example_task.py"), str(tmp_path / "calc"),
                    "--train", "100", "--test", "50"], check=True, capture_output=True)
    lines = []
    for task, metric, value in (("lohelp", "accuracy", 40.0), ("calc", "macro_f1", 50.0)):
        for step in (0, 10):
            lines.append(json.dumps({"system": "bl_base", "body": "primary", "task": task, "lang": "de", "seed": 1,
                                     "step": step, "flops": step * 1e15, "v100_days": step * 1e-3, "split": "test",
                                     "metric": metric, "value": value + step}))
    (tmp_path / "runs" / "x" / "bl_base").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "bl_base" / "results.jsonl").write_text("\n".join(lines) + "\n")
    calc = ["tasks.calc.kind=local", f"tasks.calc.source={tmp_path / 'calc'}", "tasks.calc.text_fields=[passage]",
            "tasks.calc.label_field=about_calc", "tasks.calc.main_metric=macro_f1"]
    args = ["report", str(ROOT / "experiments" / "demo.yaml"), "name=x", f"runs_dir={tmp_path / 'runs'}",
            "target_langs=[de]", *calc, "finetune.tasks=[calc]"]  # lohelp is no longer finetuned here
    assert main(args) == 0
    report = (tmp_path / "runs" / "x" / "report.md").read_text()
    assert "**calc** (macro_f1)" in report and "**lohelp** (accuracy)" in report
    assert "| majority class (train): macro_f1 | 44.4 | 44.4 |" in report  # calc: 80% 'no'
    assert "| majority class (train): accuracy | 32.4 | 32.4 |" in report  # lohelp in German

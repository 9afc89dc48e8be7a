"""A user's own task, as docs/own-task.md (once the README's "Your own task") runs it: a CSV task with its own
column names, imbalanced, in a new experiment that extends another and reuses its models (models_from); metrics
beyond accuracy, saved predictions, and a report with the task's baselines."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from minimodel.cli import main
from minimodel.errors import ConfigError
from minimodel.experiment import load_experiment
from minimodel.pipeline import plan
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

def write_task(root: Path) -> Path:
    """docs/own-task.md's example task (scripts/make_example_task.py): 'is this paragraph about Calc?', columns
    passage / about_calc, 80% 'no'; 300 training and 120 test examples per language."""
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_example_task.py"), str(root), "--train", "300",
                    "--test", "120"], check=True, capture_output=True)
    return root


@pytest.fixture(scope="module")
def own_task(tiny_finetuned, tmp_path_factory):
    tmp, cfg, args = tiny_finetuned
    task_dir = write_task(tmp_path_factory.mktemp("calc") / "calc")
    exp = task_dir.parent / "calc.yaml"
    exp.write_text(f"""extends: {ROOT / 'experiments' / 'tiny.yaml'}
name: calc
models_from: tiny
tasks:
  calc:
    kind: local
    source: {task_dir}
    text_fields: [passage]
    label_field: about_calc
    lr: 1.0e-3
    max_len: 64
    metrics: [accuracy, macro_f1, per_class_f1, confusion]
    main_metric: macro_f1
""")
    overrides = [*args[1:], "finetune.tasks=[calc]", "finetune.seeds=[1]", "logging.wandb=disabled"]
    reused = Path(cfg.runs_dir) / "tiny"
    before = {p: p.stat().st_mtime_ns for p in reused.rglob("*")}
    assert main(["run", str(exp), *overrides, "--no-progress"]) == 0
    after = {p: p.stat().st_mtime_ns for p in reused.rglob("*")}
    return {"exp": exp, "overrides": overrides, "runs": Path(cfg.runs_dir), "before": before, "after": after}


def test_a_new_experiment_reuses_the_models_and_writes_nothing_there(own_task):
    assert own_task["after"] == own_task["before"]  # no file added, none touched (mtimes equal)
    names = [s.name for s in plan(own_task["exp"], own_task["overrides"])]
    assert names == ["prepare-en", "prepare-de", "prepare-tr", "finetune-calc-s1", "evaluate-de", "evaluate-tr",
                     "report"]  # no pretrain, no adapt
    mine = own_task["runs"] / "calc" / "bl_base"
    assert (mine / "finetune" / "calc" / "seed1" / "model.pt").is_file() and (mine / "results.jsonl").is_file()
    done = json.loads((mine / "finetune" / "calc" / "seed1" / "done.json").read_text())
    assert done["inputs"]["pretrain"]["run"] == str(own_task["runs"] / "tiny" / "bl_base" / "pretrain")


def test_steps_of_the_reused_experiment_are_refused(own_task, capsys):
    assert main(["adapt", str(own_task["exp"]), *own_task["overrides"], "lang=de", "adapt.optim.lr=0.5"]) == 2
    assert "belongs to experiment tiny, whose models this one reuses (models_from)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"models_from=tiny: experiment tiny has no adaptation to fr for bl_base .*"
                                          r"Adapt it here, in this experiment's own runs") as e:
        plan(own_task["exp"], [*own_task["overrides"], "target_langs=[de,fr]"])
    message = str(e.value)  # the commands that adapt fr here (issue 54: never into tiny), not "finish it in tiny"
    assert "--langs=fr" in message and "lang=fr`" in message and "name=tiny" not in message
    assert "--adapt-missing" in message and str(own_task["runs"] / "calc" / "bl_base" / "adapt" / "fr") in message
    with pytest.raises(ConfigError, match=r"models_from='calc': the name of another experiment"):
        load_experiment(own_task["exp"], [*own_task["overrides"], "models_from=calc"])


def test_metrics_predictions_and_the_report(own_task):
    mine = own_task["runs"] / "calc" / "bl_base"
    rows = [json.loads(line) for line in (mine / "results.jsonl").read_text().splitlines()]
    metrics = {r["metric"] for r in rows if r["lang"] == "de" and r["step"] >= 0}
    assert {"accuracy", "macro_f1", "f1/no", "f1/yes", "confusion/no/yes", "confusion/yes/yes"} <= metrics
    final = max(r["step"] for r in rows if r["lang"] == "de")
    for lang in ("de", "tr"):
        preds = [json.loads(line) for line in
                 (mine / "predictions" / "calc" / lang / f"seed1-step{final:07d}.jsonl").read_text().splitlines()]
        assert len(preds) == 120 and set(preds[0]) == {"id", "gold", "predicted", "probabilities"}
        assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-4 for p in preds)
        accuracy = 100 * sum(p["gold"] == p["predicted"] for p in preds) / len(preds)
        reported = next(r["value"] for r in rows if r["lang"] == lang and r["step"] == final and r["metric"] == "accuracy")
        assert accuracy == pytest.approx(reported)  # the saved predictions are the ones scored
        cells = {r["metric"]: r["value"] for r in rows if r["lang"] == lang and r["step"] == final
                 and r["metric"].startswith("confusion/")}
        assert cells["confusion/yes/no"] == sum(p["gold"] == "yes" and p["predicted"] == "no" for p in preds)
    # only the final checkpoint's predictions by default
    assert len(list((mine / "predictions" / "calc" / "de").iterdir())) == 1
    report = (own_task["runs"] / "calc" / "report.md").read_text()
    assert "**calc** (macro_f1)" in report  # the main metric drives the tables
    assert "| majority class (train): macro_f1 | 44.4 | 44.4 | 44.4 |" in report  # 80% 'no': F1 80/90*100, halved
    assert "| majority class (train): accuracy | 80.0 | 80.0 | 80.0 |" in report
    assert "bl_base at step 0 (macro_f1)" in report


def test_adapt_missing_adapts_a_language_the_reused_experiment_lacks_in_its_own_runs(own_task, caplog):
    """`minimodel run --adapt-missing` (issue 29 part 9; issue 54: never into the reused experiment): the language the
    reused experiment was never adapted to gets an adaptation step writing into this experiment's own runs; the
    languages it has are still not redone."""
    overrides = [*own_task["overrides"], "target_langs=[de,fr]"]
    steps = {s.name: s for s in plan(own_task["exp"], overrides, adapt_missing=True)}
    assert "adapt-de" not in steps and "adapt-fr" in steps
    adapt = steps["adapt-fr"]
    assert adapt.run_dir == str(own_task["runs"] / "calc" / "bl_base" / "adapt" / "fr")
    assert adapt.args[-1] == "lang=fr" and "name=tiny" not in adapt.args and "prepare-fr" in adapt.after
    assert "adapt-fr" in steps["evaluate-fr"].after and "adapt-de" not in steps["evaluate-de"].after
    cfg = load_experiment(adapt.args[1], list(adapt.args[2:]))  # the step's own command: calc's adaptation to fr
    from minimodel.systems import stage_plan

    assert cfg.name == "calc" and cfg.models_from == "tiny" and cfg.lang == "fr"
    runs = stage_plan(cfg, "adapt").runs
    assert str(runs.adapt("fr")) == adapt.run_dir
    assert runs.adapt("de") == own_task["runs"] / "tiny" / "bl_base" / "adapt" / "de"  # the reused one


def test_a_new_language_with_its_own_corpus_goes_into_the_reusing_experiment(own_task, tmp_path, corpus_dir):
    """Issue 54: adding French with a corpus of one's own under `models_from: tiny` and `--adapt-missing` used to write
    tiny's French embeddings from the new corpus with no word. Now tiny's runs are not touched: French is adapted
    and evaluated in calc's own runs, recording the prepared data it read. (Last in this file: it adds French to
    calc's results and report.)"""
    from minimodel.store.provenance import recorded_inputs
    from tests.conftest import real_text

    mine = tmp_path / "corpus"
    shutil.copytree(corpus_dir, mine)  # the same English, German, Turkish text
    (mine / "fr.txt").write_text(real_text("fr", 300_000), encoding="utf-8")  # and French of one's own
    task = Path(load_experiment(own_task["exp"], own_task["overrides"]).tasks["calc"].source)
    if not (task / "test.fr.csv").exists():
        shutil.copy(task / "test.de.csv", task / "test.fr.csv")
    reused = own_task["runs"] / "tiny"
    before = {p: p.stat().st_mtime_ns for p in reused.rglob("*")}
    overrides = [*own_task["overrides"], "target_langs=[de,fr]", f"data.corpus_dir={mine}"]
    assert main(["run", str(own_task["exp"]), *overrides, "--adapt-missing", "--no-progress"]) == 0
    assert {p: p.stat().st_mtime_ns for p in reused.rglob("*")} == before  # nothing of tiny written
    assert not (reused / "bl_base" / "adapt" / "fr").exists()
    fr = own_task["runs"] / "calc" / "bl_base" / "adapt" / "fr"
    assert (fr / "done.json").is_file()
    corpus = recorded_inputs(fr)["target_data"]["parts"]["corpus"]
    assert corpus["file"] == "fr.txt" and corpus["bytes"] == (mine / "fr.txt").stat().st_size
    rows = [json.loads(line) for line in (own_task["runs"] / "calc" / "bl_base" / "results.jsonl").read_text()
            .splitlines()]
    assert any(r["lang"] == "fr" for r in rows)

"""Every result bound to the run that made it (issue 25, parts 1-2): a redone adaptation or finetuning replaces
its rows, leftovers of an earlier attempt never join a curve, an unfinished run is never read as finished,
a consumer refuses a producer that ran with other settings than it expects, conflicting rows are an error,
and a run's identity follows its content, not the time it was written."""

from __future__ import annotations

import json
import shutil

import pytest

from minimodel.cli import main
from minimodel.errors import ERROR_EXIT, STOPPED_EXIT, ConfigError, UserError
from minimodel.experiment import load_experiment
from minimodel.store.provenance import run_identity, stale_rows, stamp
from minimodel.store.results import ResultsTable
from tests.test_consumers import copied_chain  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow


def rows_of(system, lang=None, split="test"):
    rows = ResultsTable(system / "results.jsonl").rows()
    return [r for r in rows if r["split"] == split and (lang is None or r["lang"] == lang)]


def test_rows_record_the_runs_they_came_from(copied_chain):  # noqa: F811
    system, experiment, overrides = copied_chain
    assert main(["evaluate", experiment, *overrides, "--no-progress"]) == 0
    for r in rows_of(system):
        if r["lang"] == "en":
            assert r["finetune_id"] == run_identity(system / "finetune" / "lohelp" / f"seed{r['seed']}")
        else:
            assert r["adapt_id"] == run_identity(system / "adapt" / r["lang"])
            assert r["finetune_id"] == run_identity(system / "finetune" / "lohelp" / f"seed{r['seed']}")


def test_a_redone_adaptation_replaces_its_rows_and_predictions(copied_chain, capsys):  # noqa: F811
    """Case a: adapt/de deleted and redone with another learning rate. Evaluating it with that setting replaces
    its old rows (and predictions); evaluating with the configuration's own setting is refused for de."""
    system, experiment, overrides = copied_chain
    assert main(["evaluate", experiment, *overrides, "--no-progress"]) == 0  # rows with identities
    before = rows_of(system, "de")
    tr_before = rows_of(system, "tr")
    old_id = run_identity(system / "adapt" / "de")
    shutil.rmtree(system / "adapt" / "de")
    assert main(["adapt", experiment, *overrides, "lang=de", "adapt.optim.lr=3e-2", "--no-progress"]) == 0
    new_id = run_identity(system / "adapt" / "de")
    assert new_id != old_id
    predictions = system / "predictions" / "lohelp" / "de" / "seed1-step0000008.jsonl"
    old_predictions = predictions.read_text()  # the final checkpoint's predictions are saved by default
    assert main(["evaluate", experiment, *overrides, "adapt.optim.lr=3e-2", "lang=de", "--no-progress"]) == 0
    assert "came from runs redone, or evaluation data changed, since (lohelp seed 1 de, lohelp seed 2 de)" in \
        capsys.readouterr().err
    assert predictions.read_text() != old_predictions
    assert main(["evaluate", experiment, *overrides, "--no-progress"]) == ERROR_EXIT  # the config says lr 2e-3
    assert "adapt.optim.lr: 0.03 there, 0.002 here" in capsys.readouterr().err
    after = rows_of(system, "de")
    assert len(after) == len(before) and {r["adapt_id"] for r in after} == {new_id}
    assert {(r["seed"], r["step"]) for r in after} == {(r["seed"], r["step"]) for r in before}
    assert [r["value"] for r in after] != [r["value"] for r in before]
    assert rows_of(system, "tr") == tr_before  # the other language untouched
    assert main(["report", experiment, *overrides, "--no-progress"]) == 0  # one row per evaluation: no conflict


def test_an_unfinished_adaptation_is_not_evaluated_or_exported(copied_chain, tmp_path, capsys):  # noqa: F811
    """Case c: an adaptation stopped at stop_at is not read as finished."""
    system, experiment, overrides = copied_chain
    shutil.rmtree(system / "adapt" / "de")
    assert main(["adapt", experiment, *overrides, "lang=de", "adapt.trainer.stop_at=4", "--no-progress"]) == STOPPED_EXIT
    assert main(["evaluate", experiment, *overrides, "lang=de", "--no-progress"]) == ERROR_EXIT
    err = capsys.readouterr().err
    assert f"the adaptation of de {system / 'adapt' / 'de'} is not finished" in err
    assert main(["export", experiment, *overrides, "lang=de", "--out", str(tmp_path / "x"), "--no-progress"]) == ERROR_EXIT
    assert "is not finished" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_leftovers_of_a_stopped_adaptation_never_join_a_new_curve(copied_chain, capsys):  # noqa: F811
    """Case b: a stopped run whose last.ckpt was deleted, restarted with other settings: refused, naming the
    key; with its own settings: the earlier attempt's checkpoints after update 0 go and are written again."""
    system, experiment, overrides = copied_chain
    run = system / "adapt" / "de"
    shutil.rmtree(run)
    assert main(["adapt", experiment, *overrides, "lang=de", "adapt.trainer.stop_at=4", "--no-progress"]) == STOPPED_EXIT
    (run / "checkpoints" / "last.ckpt").unlink()
    assert (run / "embeddings" / "step0000004.pt").exists()
    assert main(["adapt", experiment, *overrides, "lang=de", "adapt.optim.lr=3e-2", "--no-progress"]) == ERROR_EXIT
    assert "adapt.optim.lr: 0.002 -> 0.03" in capsys.readouterr().err
    assert main(["adapt", experiment, *overrides, "lang=de", "--no-progress"]) == 0
    assert "removed 1 file(s) an earlier attempt wrote after update 0 (step0000004.pt)" in capsys.readouterr().err
    assert sorted(p.name for p in (run / "embeddings").glob("*.pt")) == [
        "step0000000.pt", "step0000004.pt", "step0000008.pt"]


def test_evaluation_refuses_other_task_settings_than_finetuning(copied_chain):  # noqa: F811
    """Case d: scores computed on another featurisation than the model was finetuned on."""
    system, experiment, overrides = copied_chain
    for change, key in (("tasks.lohelp.max_len=40", "tasks.lohelp.max_len: 64 there, 40 here"),
                        ("tasks.lohelp.text_fields=[id]", "tasks.lohelp.text_fields")):
        cfg = load_experiment(experiment, [*overrides, change])
        from minimodel.stages.evaluate import run_evaluate

        with pytest.raises(ConfigError, match=rf"evaluation reads .*finetune/lohelp/seed1, which ran with other "
                                              rf"settings .*{key.replace('[', '.').replace(']', '.')}"):
            run_evaluate(cfg, progress=False)


def test_a_stage_refuses_a_producer_that_ran_with_other_settings(copied_chain, capsys):  # noqa: F811
    """Case e: finetuning (run directly) over a pretraining of 8 updates while the configuration says 30."""
    system, experiment, overrides = copied_chain
    shutil.rmtree(system / "finetune" / "lohelp" / "seed1")
    assert main(["finetune", experiment, *overrides, "task=lohelp", "seed=1", "pretrain.optim.updates=30",
                 "--no-progress"]) == ERROR_EXIT
    err = capsys.readouterr().err
    assert "stage finetune/lohelp/seed1 reads" in err and "pretrain.optim.updates: 8 there, 30 here" in err
    assert not (system / "finetune" / "lohelp" / "seed1").exists()


def test_identity_follows_content_not_the_time_of_writing(copied_chain):  # noqa: F811
    """Case i: a finished stage whose done.json is deleted and rerun (training nothing) keeps its identity, so
    what was built on it stays valid; its results are not redone."""
    system, experiment, overrides = copied_chain
    assert main(["evaluate", experiment, *overrides, "--no-progress"]) == 0
    results = (system / "results.jsonl").read_text()
    for run, command in ((system / "pretrain", ["pretrain"]),
                         (system / "finetune" / "lohelp" / "seed1", ["finetune", "task=lohelp", "seed=1"])):
        before = json.loads((run / "done.json").read_text())
        (run / "done.json").unlink()
        assert main([command[0], experiment, *overrides, *command[1:], "--no-progress"]) == 0
        after = json.loads((run / "done.json").read_text())
        assert after["identity"] == before["identity"]
    assert main(["adapt", experiment, *overrides, "lang=de", "--no-progress"]) == 0  # skipped: not stale
    assert main(["evaluate", experiment, *overrides, "--no-progress"]) == 0
    assert (system / "results.jsonl").read_text() == results  # nothing evaluated again


def test_a_truncated_finetuned_model_gives_advice_that_works(copied_chain, capsys):  # noqa: F811
    """Case h: model.pt cut short; the message's instruction rebuilds it from the finished run's checkpoint."""
    system, experiment, overrides = copied_chain
    model = system / "finetune" / "lohelp" / "seed1" / "model.pt"
    data = model.read_bytes()
    model.write_bytes(data[: len(data) // 3])
    (system / "results.jsonl").unlink()
    assert main(["evaluate", experiment, *overrides, "--no-progress"]) == ERROR_EXIT
    err = capsys.readouterr().err
    assert f"delete {model.parent / 'done.json'} and rerun `minimodel finetune ... task=lohelp seed=1`" in err
    ident = run_identity(model.parent)
    (model.parent / "done.json").unlink()
    assert main(["finetune", experiment, *overrides, "task=lohelp", "seed=1", "--no-progress"]) == 0
    assert run_identity(model.parent) == ident and len(model.read_bytes()) > len(data) // 2
    assert main(["evaluate", experiment, *overrides, "--no-progress"]) == 0


def test_a_redone_pretraining_makes_its_consumers_stale(copied_chain):  # noqa: F811
    system, experiment, overrides = copied_chain
    done = json.loads((system / "pretrain" / "done.json").read_text())
    (system / "pretrain" / "done.json").write_text(json.dumps({**done, "identity": "0123456789abcdef"}))
    with pytest.raises(UserError, match=r"adapt/de was built on the body run .*pretrain as it finished at update 8 "
                                        r"\(.*\), but that run was redone since"):
        from minimodel.stages.adapt import run_adapt

        run_adapt(load_experiment(experiment, [*overrides, "lang=de"]), progress_bar=False)
    assert stamp(system / "pretrain")["identity"] == "0123456789abcdef"


# ------------------------------------------------------------------------------------- fast: rows and tables

@pytest.mark.parametrize("same", [True, False])
def test_duplicate_rows_collapse_and_conflicting_ones_are_an_error(tmp_path, same):
    """Case f: two rows of one evaluation with different values are an error naming the file and the lines."""
    row = {"system": "bl_base", "body": "primary", "task": "xnli", "lang": "de", "seed": 1, "step": 5,
           "flops": 1.0, "v100_days": 0.0, "split": "test", "metric": "accuracy", "value": 50.0}
    other = {**row, "step": 10}
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (row, other, row if same else {**row, "value": 40.0})))
    if same:
        assert ResultsTable(path).rows() == [row, other]
    else:
        with pytest.raises(UserError, match=r"results.jsonl: lines 1 and 3 are results of the same evaluation "
                                            r"\(system=bl_base, .*step=5, split=test, metric=accuracy\) with "
                                            r"different contents \(value 50.0 and 40.0\)"):
            ResultsTable(path).rows()


def test_remove_takes_exactly_the_stale_rows(tmp_path):
    rows = [{"system": "s", "body": "primary", "task": "t", "lang": "de", "seed": s, "step": 1, "flops": 1.0,
             "v100_days": 0.0, "split": "test", "metric": "accuracy", "value": float(s), "adapt_id": "a" if s < 3
             else "b", "finetune_id": "f"} for s in (1, 2, 3)]
    table = ResultsTable(tmp_path / "results.jsonl")
    table.append(rows)
    current = {("t", s, "primary", "de"): {"adapt_id": "b", "finetune_id": "f"} for s in (1, 2, 3)}
    stale = stale_rows(table.rows(), current, lambda r: (r["task"], r["seed"], r["body"], r["lang"]))
    assert [r["seed"] for r in stale] == [1, 2]
    assert table.remove(stale) == 2
    assert [r["seed"] for r in table.rows()] == [3]
    assert table.append(rows[:1]) == rows[:1]  # a removed row can be written again

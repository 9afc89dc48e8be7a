"""Bad sizes and override values fail at load time naming the key; a finished stage run is reused only with the
settings it ran with; a corrupt done.json and malformed result rows give clear messages, never tracebacks. Values
that name paths, the W&B project and empty finetuning lists are refused at load time; task files that repeat a
column or key and Hugging Face weights that are not plain data are refused naming the file (issue 25)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from minimodel import log as logs
from minimodel.cli import main
from minimodel.config.load import save_config
from minimodel.errors import CheckpointError, ConfigError, UserError
from minimodel.experiment import load_experiment
from minimodel.report.reading import load_results
from minimodel.store.identity import check_finished, stage_changes
from minimodel.store.layout import CONFIG, DONE, read_done
from minimodel.store.results import ResultsTable
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_overrides

TINY_YAML = ROOT / "experiments" / "tiny.yaml"


def err_of(capsys: pytest.CaptureFixture) -> str:
    return capsys.readouterr().err


# ---- 1. zero and negative sizes ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("override", "message"), [
    ("pretrain.optim.updates=0", "pretrain.optim.updates must be a positive integer, got 0"),
    ("pretrain.optim.updates=-5", "pretrain.optim.updates must be a positive integer, got -5"),
    ("pretrain.optim.micro_batch=0", "pretrain.optim.micro_batch must be a positive integer, got 0"),
    ("pretrain.optim.micro_batch=-8", "pretrain.optim.micro_batch must be a positive integer, got -8"),
    ("pretrain.optim.global_batch=0", "pretrain.optim.global_batch must be a positive integer, got 0"),
    ("bridge.optim.updates=0", "bridge.optim.updates must be a positive integer, got 0"),
    ("adapt.optim.micro_batch=0", "adapt.optim.micro_batch must be a positive integer, got 0"),
    ("adapt.optim.lr=0", "adapt.optim.lr must be a positive number, got 0.0"),
    ("pretrain.optim.lr=-1e-3", "pretrain.optim.lr must be a positive number, got -0.001"),
    ("pretrain.optim.lr=.nan", "pretrain.optim.lr must be a positive number, got nan"),
    ("pretrain.optim.warmup_updates=-1", "pretrain.optim.warmup_updates must be 0 or a positive integer, got -1"),
    ("pretrain.optim.betas=[0.9]", r"pretrain.optim.betas must be two numbers in \[0, 1\)"),
    ("pretrain.trainer.ckpt_every=0", "pretrain.trainer.ckpt_every must be a positive integer, got 0"),
    ("adapt.trainer.val_every=-2", "adapt.trainer.val_every must be a positive integer, got -2"),
    ("adapt.trainer.ckpt_steps=[10,0]", "adapt.trainer.ckpt_steps must be a list of positive update counts, got 0"),
    ("pretrain.trainer.stop_at=-1", r"pretrain.trainer.stop_at must be 0 \(no stop\) or a positive integer, got -1"),
    ("pretrain.trainer.devices=0", "pretrain.trainer.devices must be a positive number of devices"),
    ("finetune.trainer.log_every=0", "finetune.trainer.log_every must be a positive integer, got 0"),
    ("finetune.micro_batch=0", "finetune.micro_batch must be a positive integer, got 0"),
    ("finetune.batch_size=0", "finetune.batch_size must be a positive integer, got 0"),
    ("finetune.epochs=0", "finetune.epochs must be a positive number, got 0.0"),
    ("finetune.warmup_ratio=1.5", r"finetune.warmup_ratio must be in \[0, 1\), got 1.5"),
    ("data.seq_len=1", r"data.seq_len must be at least 8 \(tokens per MLM block\), got 1"),
    ("data.val_blocks=-1", "data.val_blocks must be 0 or a positive integer, got -1"),
    ("model.heads=0", "model.heads must be a positive integer, got 0"),
    ("model.layers=-1", "model.layers must be a positive integer, got -1"),
    ("model.dropout=1.0", r"model.dropout must be in \[0, 1\), got 1.0"),
    ("bridge.layers=0", "bridge.layers must be a positive integer, got 0"),
    ("tasks.xnli.max_len=0", "tasks.xnli.max_len must be at least 8"),
    ("seed=-1", "seed must be in 0..4294967295"),
])
def test_sizes_are_checked_at_load_time_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=f"^{TINY_YAML}: {message}"):
        load_experiment(TINY_YAML, [override])


def test_zero_updates_is_refused_by_the_cli_before_anything_is_written(tmp_path, capsys):
    rc = main(["pretrain", str(TINY_YAML), f"runs_dir={tmp_path / 'runs'}", "pretrain.optim.updates=0",
               "--no-progress"])
    assert rc == 2
    err = err_of(capsys)
    assert f"[minimodel] pretrain: error: {TINY_YAML}: pretrain.optim.updates must be a positive integer, got 0" in err
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


# ---- 5. malformed override values -------------------------------------------------------------------------------

@pytest.mark.parametrize(("override", "problem"), [
    ("pretrain.optim.lr=[1,", "while parsing a flow node: did not find expected node content"),
    ("model.mini_heads={a", "while parsing a flow mapping: did not find expected ',' or '}'"),
    ("name=a: b", "mapping values are not allowed in this context"),
])
def test_a_malformed_override_value_names_the_override(override, problem, capsys):
    assert main(["pretrain", str(TINY_YAML), override, "--no-progress"]) == 2
    err = err_of(capsys)
    assert f"[minimodel] pretrain: error: override '{override}': not a valid value (YAML: {problem})" in err
    assert "Traceback" not in err


def test_a_quoted_override_value_is_a_string():
    assert load_experiment(TINY_YAML, ["runs_dir='a: b'"]).runs_dir == "a: b"


# ---- 6. values that name directories and files (issue 25, j) --------------------------------------------------------

RULE = r"use ASCII letters, digits, '\.', '_' and '-' \(not empty, not '\.' or '\.\.'\)"


@pytest.mark.parametrize(("override", "message"), [
    ("name=../../x", r"name='\.\./\.\./x': it names the experiment's directory \(\{runs_dir\}/\{name\}\)"),
    ("name=..", r"name='\.\.': it names the experiment's directory"),
    ("name=.", r"name='\.': it names the experiment's directory"),
    ("name=", r"name='': it names the experiment's directory"),
    ("name=/tmp/x", r"name='/tmp/x': it names the experiment's directory"),
    ("tag=../x", r"tag='\.\./x': it names the system's run directory"),
    ("target_langs=[de,../x]", r"target_langs='\.\./x': it names a language's runs"),
    ("target_langs=[de,'']", r"target_langs='': it names a language's runs"),
    ("lang=..", r"lang='\.\.': it names the adaptation run"),
    ("source_lang=e/n", r"source_lang='e/n': it names the language's prepared data"),
    ("tasks.xnli.langs=[de,..]", r"tasks\.xnli\.langs='\.\.': it names a language's test file"),
    ("tasks.a/b.kind=hub", r"tasks: the task name 'a/b': it names a task's finetuning runs"),
    ("models_from=..", r"models_from='\.\.': the name of another experiment"),
])
def test_values_that_name_paths_are_checked_at_load_time(override, message):
    with pytest.raises(ConfigError, match=f"^{TINY_YAML}: {message}.*; {RULE}$"):
        load_experiment(TINY_YAML, [override])


def test_ordinary_names_and_languages_pass():
    cfg = load_experiment(TINY_YAML, ["name=study-2.v1_b", "tag=n6", "target_langs=[zh-CN,pt_BR]", "lang=zh-CN"])
    assert (cfg.name, cfg.label, cfg.target_langs) == ("study-2.v1_b", "minijoint-n6", ["zh-CN", "pt_BR"])


@pytest.mark.parametrize("name", ["../../escaped", "/abs-escaped"])
def test_a_name_outside_runs_dir_is_refused_before_anything_is_written(tmp_path, capsys, name):
    runs = tmp_path / "a" / "b" / "runs"
    rc = main(["pretrain", str(TINY_YAML), f"runs_dir={runs}", f"name={tmp_path / name if name[0] == '/' else name}",
               "--no-progress"])
    err = err_of(capsys)
    assert rc == 2 and "Traceback" not in err
    assert f"[minimodel] pretrain: error: {TINY_YAML}: name=" in err and "it names the experiment's directory" in err
    assert list(tmp_path.iterdir()) == []  # neither runs_dir nor anything beside it


@pytest.mark.parametrize("langs", ["../x", "en,..", "en,"])
def test_prepare_langs_outside_the_prepared_dir_are_refused(tmp_path, capsys, langs):
    rc = main(["prepare", str(TINY_YAML), f"data.corpus_dir={tmp_path}", f"data.prepared_dir={tmp_path / 'p'}",
               f"--langs={langs}", "--no-progress"])
    err = err_of(capsys)
    assert rc == 2 and "Traceback" not in err
    assert f"--langs={langs!r}: the language" in err and "names a corpus file and a prepared directory" in err
    assert list(tmp_path.iterdir()) == []


# ---- 7. W&B project and entity, checked before a stage writes anything (issue 25, section 3) -------------------------

@pytest.mark.parametrize(("override", "message"), [
    ("logging.project=team/proj", r"logging\.project='team/proj': a W&B project name cannot contain / \(wandb "
                                  r"refuses any of / \\ # \? % :\); set logging\.project to another name"),
    ("logging.project='a:b?'", r"logging\.project='a:b\?': a W&B project name cannot contain \? :"),
    (f"logging.project={'p' * 129}", r"logging\.project: a W&B project name has at most 128 characters, this one 129"),
    (f"name={'n' * 120}", r"logging\.project \(default minimodel-\{name\}: 'minimodel-n+'\): a W&B project name has "
                          r"at most 128 characters, this one 130"),
    ("logging.entity='my team'", r"logging\.entity='my team': a W&B entity is a user or team name, without spaces"),
    ("logging.entity=org/team", r"logging\.entity='org/team': a W&B entity is a user or team name"),
])
def test_wandb_project_and_entity_are_checked_at_load_time(override, message):
    with pytest.raises(ConfigError, match=f"^{TINY_YAML}: {message}"):
        load_experiment(TINY_YAML, ["logging.wandb=offline", override])


def test_what_wandb_accepts_passes_and_agrees_with_wandb():
    wandb_settings = pytest.importorskip("wandb.sdk.wandb_settings")
    for project in ("minimodel-study", "p" * 128, "my project (v2)"):
        load_experiment(TINY_YAML, [f"logging.project='{project}'", "logging.entity=my-team_1"])
        wandb_settings.Settings(project=project)  # wandb's own rule accepts it too
    for bad in ("a/b", "a\\b", "a#b", "a?b", "a%b", "a:b", "p" * 129):
        with pytest.raises(Exception, match="Invalid project name"):
            wandb_settings.Settings(project=bad)
        with pytest.raises(ConfigError, match="W&B project name"):
            load_experiment(TINY_YAML, [f"logging.project='{bad}'"])


def test_an_invalid_wandb_project_fails_before_a_stage_writes(tmp_path, capsys):
    rc = main(["pretrain", str(TINY_YAML), f"runs_dir={tmp_path / 'runs'}", "logging.wandb=offline",
               "logging.project=team/proj", "--no-progress"])
    err = err_of(capsys)
    assert rc == 2 and "Traceback" not in err
    assert f"[minimodel] pretrain: error: {TINY_YAML}: logging.project='team/proj': a W&B project name" in err
    assert not (tmp_path / "runs").exists()


# ---- 8. an empty list of finetuning seeds or tasks (issue 25, l) ------------------------------------------------------

@pytest.mark.parametrize(("override", "message"), [
    ("finetune.seeds=[]", r"finetune\.seeds is empty: steps 3 and 4 \(finetuning, evaluation\) would do nothing; give "
                          r"at least one seed, e\.g\. finetune\.seeds=\[1\]"),
    ("finetune.tasks=[]", r"finetune\.tasks is empty: steps 3 and 4 \(finetuning, evaluation\) would do nothing; name "
                          r"at least one task \(defined under tasks: \['mlqa', 'pawsx', 'xnli', 'xquad'\]\)"),
    ("finetune.mini_tasks=[nli]", r"finetune\.mini_tasks names 'nli', which is not defined under tasks:"),
])
def test_empty_finetuning_lists_are_refused_at_load_time(override, message):
    with pytest.raises(ConfigError, match=f"^{TINY_YAML}: {message}"):
        load_experiment(TINY_YAML, [override])


def test_an_empty_finetuning_list_is_fine_when_the_command_names_the_run():
    cfg = load_experiment(TINY_YAML, ["finetune.seeds=[]", "finetune.tasks=[]", "task=xnli", "seed=3"])
    assert (cfg.task, cfg.seed) == ("xnli", 3)


def test_empty_finetune_seeds_is_not_a_silent_success(tmp_path, capsys):
    rc = main(["finetune", str(TINY_YAML), f"runs_dir={tmp_path / 'runs'}", "finetune.seeds=[]", "--no-progress"])
    err = err_of(capsys)
    assert rc == 2 and "Traceback" not in err
    assert f"[minimodel] finetune: error: {TINY_YAML}: finetune.seeds is empty" in err


# ---- 2. a finished stage and a changed configuration: the comparison --------------------------------------------

def as_dict(*overrides: str) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(load_experiment(TINY_YAML, list(overrides))))  # type: ignore[return-value]


def test_settings_that_do_not_decide_a_stage_result_do_not_count(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    saved = as_dict("data.prepared_dir=prep", "lang=de", "task=xnli", "seed=1")
    current = as_dict(f"data.prepared_dir={tmp_path / 'prep'}", "lang=tr", "task=pawsx", "seed=2",
                      "pretrain.trainer.stop_at=5", "pretrain.trainer.max_minutes=3", "pretrain.trainer.log_every=1",
                      "pretrain.trainer.val_every=7", "pretrain.trainer.devices=2", "pretrain.trainer.compile=true",
                      "pretrain.trainer.ckpt_every=3", "finetune.trainer.ckpt_every=3", "bridge.trainer.ckpt_steps=[1]",
                      "pretrain.optim.micro_batch=8", "data.num_workers=0", f"data.corpus_dir={tmp_path}",
                      "logging.wandb=offline", "logging.project=p", "target_langs=[de]", "finetune.eval_batch=8",
                      "tasks.xnli.langs=[de]", "system=bl_base", "model.mini_heads=[]", "tag=x")
    # (model.mini_heads is the model: it is compared below; here only the system is swapped)
    current["model"]["mini_heads"] = saved["model"]["mini_heads"]
    for stage in ("pretrain", "bridge", "adapt/de", "finetune/xnli/seed1", "finetune/xnli/seed1/mini"):
        assert stage_changes(saved, current, stage) == [], stage


def test_settings_that_decide_a_stage_result_are_listed_old_to_new():
    saved = as_dict()
    current = as_dict("pretrain.optim.lr=2e-3", "model.hidden=128", "adapt.optim.updates=7",
                      "tasks.xnli.lr=3e-5", "tasks.pawsx.lr=3e-5", "finetune.epochs=1")
    assert stage_changes(saved, current, "pretrain") == [("model.hidden", 64, 128), ("pretrain.optim.lr", 1e-3, 2e-3)]
    assert stage_changes(saved, current, "adapt/de") == [("adapt.optim.updates", 200, 7), ("model.hidden", 64, 128)]
    assert stage_changes(saved, current, "finetune/xnli/seed2") == [
        ("finetune.epochs", 3.0, 1.0), ("model.hidden", 64, 128), ("tasks.xnli.lr", 1e-5, 3e-5)]


def test_adaptation_checkpoints_are_part_of_its_result():  # step 4 evaluates each of them
    saved, current = as_dict(), as_dict("adapt.trainer.ckpt_steps=[5]", "adapt.trainer.ckpt_every=50")
    assert stage_changes(saved, current, "adapt/tr") == [("adapt.trainer.ckpt_every", 100, 50),
                                                         ("adapt.trainer.ckpt_steps", [], [5])]


def test_a_key_the_saved_config_lacks_counts_as_its_default():
    saved, current = as_dict(), as_dict("adapt.trainer.ckpt_steps=[5]")
    del saved["adapt"]["trainer"]["ckpt_steps"], saved["model"]["init_std"]  # an older minimodel's config.yaml
    saved["adapt"]["optim"]["retired_key"] = 1  # a key this version no longer has
    assert stage_changes(saved, current, "adapt/de") == [("adapt.trainer.ckpt_steps", [], [5])]


def finished(tmp_path: Path, *overrides: str) -> Path:
    """A stage run directory as a finished run leaves it (config.yaml and done.json)."""
    run_dir = tmp_path / "run"
    save_config(load_experiment(TINY_YAML, list(overrides)), run_dir / CONFIG)
    (run_dir / DONE).write_text(json.dumps({"stage": "pretrain", "step": 200}))
    return run_dir


def test_a_finished_run_with_other_settings_is_refused_listing_them(tmp_path):
    run_dir = finished(tmp_path)
    check_finished(load_experiment(TINY_YAML, ["pretrain.trainer.stop_at=5"]), "pretrain", run_dir)  # the same run
    with pytest.raises(ConfigError) as e:
        check_finished(load_experiment(TINY_YAML, ["pretrain.optim.lr=2e-3", "data.seq_len=32"]), "pretrain", run_dir)
    assert str(e.value) == (
        f"{run_dir} is finished, but it ran with other settings than this configuration's ({run_dir / CONFIG}): "
        f"data.seq_len: 128 -> 32; pretrain.optim.lr: 0.001 -> 0.002. Rerun with the settings it ran with, or train "
        f"the new ones in a new run: set another name= or runs_dir= (or delete {run_dir} to train it again)")


def test_a_finished_run_is_not_extended_to_more_updates_its_schedule_ended(tmp_path):
    run_dir = finished(tmp_path)
    with pytest.raises(ConfigError, match=r"is finished with pretrain.optim.updates=200 and cannot be continued to "
                                          r"400: its learning rate decayed linearly to 0 at its last update"):
        check_finished(load_experiment(TINY_YAML, ["pretrain.optim.updates=400"]), "pretrain", run_dir)
    with pytest.raises(ConfigError, match=r"other settings than this configuration's .*"
                                          r"pretrain.optim.updates: 200 -> 100"):
        check_finished(load_experiment(TINY_YAML, ["pretrain.optim.updates=100"]), "pretrain", run_dir)


def test_a_finished_run_without_its_config_is_skipped_and_a_corrupt_one_named(tmp_path):
    run_dir = finished(tmp_path)
    (run_dir / CONFIG).write_text("pretrain: {optim: [\n")
    with pytest.raises(ConfigError, match=rf"{run_dir / CONFIG}: not valid YAML .* restore it, or delete {run_dir}"):
        check_finished(load_experiment(TINY_YAML), "pretrain", run_dir)
    (run_dir / CONFIG).unlink()
    check_finished(load_experiment(TINY_YAML, ["pretrain.optim.lr=1"]), "pretrain", run_dir)  # nothing to compare with


# ---- 3. a corrupt done.json ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "what"), [('{"stage": "pretrain", "st', "is not valid JSON"),
                                            ("[1, 2]", "holds a JSON list, not the object")])
def test_a_corrupt_done_json_names_the_file_and_the_fix(tmp_path, text, what):
    (tmp_path / DONE).write_text(text)
    with pytest.raises(UserError, match=rf"^{tmp_path / DONE} {what}.*delete it and rerun the stage that wrote it"):
        read_done(tmp_path)
    run = tmp_path / "adapt" / "de"  # a run the layout names: its command
    run.mkdir(parents=True)
    (run / DONE).write_text(text)
    with pytest.raises(UserError, match=r"delete it and rerun `minimodel adapt \.\.\. lang=de` \(the stage that wrote it\)"):
        read_done(run)


# ---- 2 and 3 through the command line -------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_finished_pretraining_is_reused_only_with_its_settings(tmp_path, prepared, corpus_dir, capsys):
    args = ["pretrain", str(TINY_YAML), *tiny_overrides(tmp_path, corpus_dir, prepared), "data.num_workers=0",
            *stage_overrides(["pretrain"], **TINY_STAGE, updates=2, ckpt_every=2, val_every=2), "--no-progress"]
    run_dir = tmp_path / "runs" / "tiny" / "minijoint" / "pretrain"
    assert main(args) == 0
    done = (run_dir / DONE).read_text()
    err_of(capsys)

    # what changes between invocations (when to stop, how often to log, micro-batches, the lang selector): skipped
    assert main([*args, "pretrain.trainer.stop_at=1", "pretrain.trainer.max_minutes=5", "pretrain.optim.micro_batch=8",
                 "pretrain.trainer.log_every=1", "lang=de"]) == 0
    assert f"[minimodel] {run_dir} is complete; skipping" in err_of(capsys)

    assert main([*args, "pretrain.optim.updates=4"]) == 2
    err = err_of(capsys)
    assert (f"[minimodel] pretrain: error: {run_dir} is finished with pretrain.optim.updates=2 and cannot be "
            f"continued to 4: its learning rate decayed linearly to 0 at its last update") in err

    assert main([*args, "pretrain.optim.lr=1e-3", "pretrain.optim.weight_decay=0.05"]) == 2
    err = err_of(capsys)
    assert (f"[minimodel] pretrain: error: {run_dir} is finished, but it ran with other settings than this "
            f"configuration's ({run_dir / CONFIG}): pretrain.optim.lr: 0.002 -> 0.001; pretrain.optim.weight_decay: 0.01 -> 0.05. "
            f"Rerun with the settings it ran with") in err
    assert "Traceback" not in err
    assert (run_dir / DONE).read_text() == done  # nothing overwritten
    assert OmegaConf.load(run_dir / CONFIG).pretrain.optim.lr == 2e-3

    (run_dir / DONE).write_text(done[: len(done) // 2])  # cut short
    assert main(args) == 2
    err = err_of(capsys)
    assert f"[minimodel] pretrain: error: {run_dir / DONE} is not valid JSON (" in err
    assert "delete it and rerun `minimodel pretrain ...` (the stage that wrote it) to finish the stage again from its " \
           "last checkpoint" in err
    (run_dir / DONE).unlink()  # the fix the message gives
    assert main(args) == 0
    assert json.loads((run_dir / DONE).read_text())["step"] == 2


# ---- 4. results rows of the wrong shape ----------------------------------------------------------------------------

ROW = {"system": "bl_base", "body": "primary", "task": "xnli", "lang": "de", "seed": 1, "step": 10, "flops": 1e15,
       "v100_days": 0.5, "split": "test", "metric": "accuracy", "value": 50.0}


def test_results_rows_of_the_wrong_shape_are_skipped_with_one_warning(tmp_path, capsys):
    path = tmp_path / "runs" / "exp" / "bl_base" / "results.jsonl"
    path.parent.mkdir(parents=True)
    english = {**ROW, "lang": "en", "step": -1, "flops": 0.0, "v100_days": 0.0}
    bad = [{k: v for k, v in ROW.items() if k != "seed"}, [1, 2], "text", 3, None, {**ROW, "seed": "one"},
           {**ROW, "value": True}]
    lines = [json.dumps(english), *(json.dumps(b) for b in bad), "{not json", "", json.dumps(ROW)]
    path.write_text("\n".join(lines) + "\n" + json.dumps(ROW)[:20])  # and a last line cut short
    logs.setup()
    table = ResultsTable(path)
    assert table.rows() == [english, ROW]
    err = err_of(capsys)
    assert err.count("[minimodel]") == 1
    assert (f"[minimodel] {path}: skipped 8 line(s) that are not result rows (not JSON, not an object with system, "
            f"body, task, lang, split, metric, seed, step, flops, v100_days, value, or a non-finite number) and a last "
            f"line cut short") in err
    assert table.keys() == {("bl_base", "primary", "xnli", "en", 1, -1), ("bl_base", "primary", "xnli", "de", 1, 10)}
    res = load_results(tmp_path / "runs", "exp")  # what the report reads
    assert res.english == {("bl_base", "primary", "xnli"): 50.0}
    assert [p.score for p in res.curves[("bl_base", "xnli", "de")]] == [50.0]
    assert "[minimodel]" not in err_of(capsys)  # one warning per file, however often the report reads it


def test_a_cut_last_line_is_not_a_row_and_is_named_in_a_warning(tmp_path, capsys):
    # issue 54 part 7 (docs/bad-input.md, Round 4): the cut line is no longer dropped without a word
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(ROW)[:20])
    logs.setup()
    assert ResultsTable(path).rows() == [ROW]
    err = err_of(capsys)
    assert f"{path}, line 2: the last line is cut short" in err and err.count("[minimodel]") == 1, err


def test_a_stopped_run_resumes_only_with_the_settings_it_started_with(tmp_path, prepared, corpus_dir, capsys):
    args = ["pretrain", str(TINY_YAML), *tiny_overrides(tmp_path, corpus_dir, prepared), "data.num_workers=0",
            *stage_overrides(["pretrain"], **TINY_STAGE, updates=4, ckpt_every=2, val_every=2), "--no-progress"]
    run_dir = tmp_path / "runs" / "tiny" / "minijoint" / "pretrain"
    assert main([*args, "pretrain.trainer.stop_at=2"]) == 4  # stopped at update 2 as asked (not finished), checkpoint written
    assert not (run_dir / DONE).exists()
    err_of(capsys)
    assert main([*args, "pretrain.optim.lr=1e-3"]) == 2
    err = err_of(capsys)
    assert (f"[minimodel] pretrain: error: {run_dir} holds a run stopped before its end that ran with other settings "
            f"than this configuration's ({run_dir / CONFIG}): pretrain.optim.lr: 0.002 -> 0.001. Resuming it would "
            f"mix the two") in err
    assert OmegaConf.load(run_dir / CONFIG).pretrain.optim.lr == 2e-3  # its record is not overwritten
    assert main(args) == 0 and (run_dir / DONE).exists()  # the same settings finish it


# ---- issue 25, k: a task file that names a column or key twice --------------------------------------------------------

@pytest.mark.parametrize("ext", ["csv", "tsv"])
def test_a_duplicated_column_in_a_task_file_is_refused_naming_file_and_column(tmp_path, ext):
    from minimodel.config.schema import TaskConfig
    from minimodel.data.tasks import TaskData
    from minimodel.errors import TaskDataError

    sep = "," if ext == "csv" else "\t"
    rows = [("id", "text", "label")] + [(f"t{i}", f"text {i}", "pos" if i % 2 else "neg") for i in range(6)]
    for split in ("train", "dev"):
        (tmp_path / f"{split}.{ext}").write_text("".join(sep.join(r) + "\n" for r in rows), encoding="utf-8")
    # the test file's second label column holds other labels: a reader keeping the last one scores against those
    test = tmp_path / f"test.de.{ext}"
    test.write_text(sep.join(("id", "text", "label", "label")) + "\n"
                    + "".join(sep.join((i, t, y, "pos")) + "\n" for i, t, y in rows[1:]), encoding="utf-8")
    data = TaskData("lohelp", TaskConfig(kind="local", source=str(tmp_path)))
    assert [r["label"] for r in data.records("train")] == [0, 1, 0, 1, 0, 1]
    with pytest.raises(TaskDataError, match=rf"^{test}, line 1: the header: column 'label' appears more than once "
                                            rf"\(\['id', 'text', 'label', 'label'\]\); a reader would keep only one "
                                            rf"of them: rename or remove the extra column$"):
        data.records("test", "de")
    # a duplicated column in train is named as such (not as a disagreement with dev)
    (tmp_path / f"train.{ext}").write_text(sep.join(("id", "text", "text", "label")) + "\nt0" + sep + "a" + sep + "b"
                                           + sep + "pos\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=rf"^{tmp_path / f'train.{ext}'}, line 1: the header: column 'text' "):
        TaskData("lohelp", TaskConfig(kind="local", source=str(tmp_path)))


def test_a_json_key_repeated_in_one_record_is_refused(tmp_path):
    from minimodel.data.task_files import LocalClassificationTask
    from minimodel.errors import TaskDataError

    good = '{"id": "a", "text": "x", "label": "pos"}\n{"id": "b", "text": "y", "label": "neg"}\n'
    (tmp_path / "train.jsonl").write_text(good, encoding="utf-8")
    task = LocalClassificationTask(tmp_path)
    test = tmp_path / "test.de.jsonl"
    test.write_text(good + '{"id": "c", "text": "z", "label": "neg", "label": "pos"}\n', encoding="utf-8")
    with pytest.raises(TaskDataError, match=rf"^{test}, line 3: key 'label' appears more than once in one JSON "
                                            rf"object \(keys: \['id', 'text', 'label'\]\); JSON readers keep only "
                                            rf"the last: rename or remove the extra one$"):
        task.load("test", "de")
    test.unlink()
    (tmp_path / "test.de.json").write_text('[{"id": "c", "text": "z", "text": "w", "label": "neg"}]', encoding="utf-8")
    with pytest.raises(TaskDataError, match=rf"^{tmp_path / 'test.de.json'}: key 'text' appears more than once"):
        task.load("test", "de")


def test_a_parquet_file_with_a_repeated_column_is_refused(tmp_path):  # (pyarrow itself refuses to read it)
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from minimodel.data.task_files import read_records
    from minimodel.errors import TaskDataError

    path = tmp_path / "test.de.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["x"]), pa.array(["neg"]), pa.array(["pos"])],
                                        names=["text", "label", "label"]), path)
    with pytest.raises(TaskDataError, match=rf"^{path}: not a readable Parquet file \(.*label"):
        list(read_records(path))


# ---- issue 25, l: bridge.source, a Hugging Face directory whose weights are a pickle ---------------------------------

def _hf_model_dir(out: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    config = transformers.RobertaConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128, max_position_embeddings=66, pad_token_id=1)
    torch.manual_seed(0)
    transformers.RobertaForMaskedLM(config).save_pretrained(str(out))
    return out


class _RunsCode:
    def __reduce__(self):
        import os

        return (os.system, ("echo this must never run",))


def test_hf_weights_that_are_not_plain_data_are_refused_in_the_documented_form(tmp_path):
    from safetensors.torch import load_file

    from minimodel.models.hf import from_hf

    d = _hf_model_dir(tmp_path / "hf")
    weights = load_file(d / "model.safetensors")
    reference = from_hf(d).state_dict()
    torch.save({**weights, "extra": _RunsCode()}, d / "pytorch_model.bin")
    # both files: model.safetensors is read, the pickle is never opened
    assert all(torch.equal(v, reference[k]) for k, v in from_hf(d).state_dict().items())
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=rf"^refusing to load {d / 'pytorch_model.bin'}: it holds a Python object "
                                              rf"\(posix\.system\) whose loading could run code; minimodel reads "
                                              rf"checkpoints as plain data .* convert a model you trust to "
                                              rf"safetensors.*save_pretrained\(DIR\)"):
        from_hf(d)
    torch.save(weights, d / "pytorch_model.bin")  # a pickle of tensors only is plain data: read as such
    assert all(torch.equal(v, reference[k]) for k, v in from_hf(d).state_dict().items())
    (d / "pytorch_model.bin").unlink()
    with pytest.raises(CheckpointError, match=rf"^{d}: no model weights in this Hugging Face model directory "
                                              rf"\(expected model\.safetensors or "):
        from_hf(d)


def test_a_pickled_hf_model_as_bridge_source_is_a_clear_error(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    d = _hf_model_dir(tmp_path / "hf")
    (d / "model.safetensors").unlink()
    model = transformers.RobertaForMaskedLM(transformers.AutoConfig.from_pretrained(str(d)))
    torch.save(model, d / "pytorch_model.bin")  # the whole module pickled, as torch.save(model) writes it
    args = ["bridge", str(ROOT / "experiments" / "tiny.yaml"), f"runs_dir={tmp_path / 'runs'}",
            f"data.prepared_dir={tmp_path / 'prepared'}", "logging.wandb=disabled", "system=minipost",
            "model.mini_heads=[]", f"bridge.source={d}", "bridge.depth=1", "--no-progress",
            "data.seq_len=64"]  # the model's 66 positions less RoBERTa's 2 (a longer one is refused first)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "UnpicklingError" not in err
    assert (f"[minimodel] bridge: error: refusing to load {d / 'pytorch_model.bin'}: it holds a Python object "
            f"(transformers.models.roberta.modeling_roberta.RobertaForMaskedLM) whose loading could run code") in err
    assert not (tmp_path / "runs").exists()


def test_an_id_field_on_a_qa_task_is_refused_at_load_time_and_decides_no_finetuning():
    """tasks.X.id_field (issue 29 part 8): a QA task's predictions carry the questions' 'id' (the hub schema);
    the ids of saved predictions are step 4's, so changing id_field redoes no finetuning."""
    with pytest.raises(ConfigError, match=rf"^{TINY_YAML}: tasks\.mlqa\.id_field='qid': a QA task's questions are "
                                          r"identified by their 'id' field \(the hub schema\), which its predictions "
                                          r"carry; leave tasks\.mlqa\.id_field unset$"):
        load_experiment(TINY_YAML, ["tasks.mlqa.id_field=qid"])
    assert load_experiment(TINY_YAML, ["tasks.xnli.id_field=pairID"]).tasks["xnli"].id_field == "pairID"
    saved = {"tasks": {"xnli": {"id_field": "", "max_len": 256}}}
    assert stage_changes(saved, {"tasks": {"xnli": {"id_field": "pairID", "max_len": 256}}}, "finetune/xnli/seed1") == []
    assert stage_changes(saved, {"tasks": {"xnli": {"id_field": "", "max_len": 128}}}, "finetune/xnli/seed1") == [
        ("tasks.xnli.max_len", 256, 128)]

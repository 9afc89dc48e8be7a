"""The bad-input catalogue: each failure gives a clear message and loses or overwrites nothing."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest
import torch

from minimodel.cli import main
from minimodel.data.encode import encode_corpus
from minimodel.data.prepare import load_source_tokenizer
from minimodel.data.tokenizer import Tokenizer, TokenizerError
from minimodel.errors import NonFiniteLossError, WriteError
from minimodel.models.model import RobertaMLM
from minimodel.models.surgery import PlugError
from minimodel.stages.evaluate import check_adaptation
from minimodel.stages.pretrain import run_pretrain
from minimodel.store.checkpoints import Adaptation, load_checkpoint
from minimodel.systems import stage_plan
from tests.conftest import ROOT, stage_overrides, tiny_config


def cfg(tmp: Path, prepared: Path, corpus: Path, *extra: str):
    return tiny_config(tmp, corpus, *stage_overrides(["pretrain"], updates=6, global_batch=8, micro_batch=4,
                                                     ckpt_every=2, log_every=1), *extra, prepared=prepared)


def test_cli_reports_missing_corpus_with_exit_code_2(tmp_path, capsys):
    rc = main(["prepare", str(ROOT / "experiments" / "tiny.yaml"), f"data.corpus_dir={tmp_path}",
               f"data.prepared_dir={tmp_path / 'p'}", "--langs=xx", "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"error: no corpus for language 'xx': expected {tmp_path / 'xx.txt'} or {tmp_path / 'xx.txt.xz'}" in err
    assert not (tmp_path / "p").exists()


def test_cli_reports_an_unknown_key(capsys):
    assert main(["pretrain", str(ROOT / "experiments" / "tiny.yaml"), "pretrain.optim.lrate=1"]) == 2
    assert "unknown config key 'pretrain.optim.lrate'" in capsys.readouterr().err


def test_tokenizer_that_does_not_match_the_embeddings(tmp_path, prepared, corpus_dir):
    c = cfg(tmp_path, prepared, corpus_dir, "data.vocab_size=2000")
    with pytest.raises(TokenizerError, match=r"spm.model has 1000 pieces but model.vocab_size is 2000"):
        load_source_tokenizer(c)


def test_adaptation_checkpoint_of_another_system_or_language(tmp_path, prepared, corpus_dir):
    c = cfg(tmp_path, prepared, corpus_dir, "system=bl_base", "model.mini_heads=[]")
    adapted = Adaptation(system="minijoint", lang="de", embeddings=torch.zeros(1), bias=torch.zeros(1), tokenizer={},
                         step=0, flops=0.0)
    with pytest.raises(PlugError, match=r"x.pt is an adaptation checkpoint of minijoint/de, not of bl_base/de"):
        check_adaptation(adapted, c, "de", Path("x.pt"))
    with pytest.raises(PlugError, match=r"of minijoint/de, not of minijoint/tr"):
        check_adaptation(adapted, tiny_config(tmp_path, corpus_dir), "tr", Path("x.pt"))


@pytest.mark.slow
def test_nan_loss_stops_naming_the_update_and_keeps_the_last_good_checkpoint(tmp_path, prepared, corpus_dir,
                                                                             monkeypatch):
    calls = {"n": 0}
    real = RobertaMLM.mlm_losses

    def poisoned(self, input_ids, labels, heads=None):
        losses = real(self, input_ids, labels, heads)
        calls["n"] += 1
        if self.training and calls["n"] > 8:  # update 5 (two micro-batches per update)
            return {k: v * float("nan") for k, v in losses.items()}
        return losses

    monkeypatch.setattr(RobertaMLM, "mlm_losses", poisoned)
    c = cfg(tmp_path, prepared, corpus_dir)
    with pytest.raises(NonFiniteLossError, match=r"not finite at update 5 \(gradient norm nan\): stopping on every process; the last checkpoint"):
        run_pretrain(c, progress_bar=False)
    ckpts = stage_plan(c, "adapt").runs.pretrain / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("*.ckpt")) == ["last.ckpt", "step0000002.ckpt", "step0000004.ckpt"]
    state = load_checkpoint(ckpts / "last.ckpt")["state_dict"]
    assert all(torch.isfinite(v).all() for v in state.values())
    assert not (stage_plan(c, "adapt").runs.pretrain / "done.json").exists()


def test_disk_full_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, prepared, corpus_dir, monkeypatch):
    c = cfg(tmp_path, prepared, corpus_dir)
    real_save = torch.save
    saves = {"n": 0}

    def full_disk(obj, f, *a, **k):
        saves["n"] += 1
        if saves["n"] >= 2:  # the second checkpoint
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(WriteError, match=r"writing .*step0000004.ckpt: no space left on device \([\d,]+ bytes "
                                         r"needed, [\d,]+ free on .*\); free some space .* and rerun the same command"):
        run_pretrain(c, progress_bar=False)
    ckpts = stage_plan(c, "adapt").runs.pretrain / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["last.ckpt", "step0000002.ckpt"]  # no temp file left
    assert load_checkpoint(ckpts / "last.ckpt")["global_step"] == 2


def test_disk_full_while_writing_shards_keeps_finished_shards(tmp_path, prepared, corpus_dir, monkeypatch):
    tok = Tokenizer(prepared / "prepared" / "en" / "spm.model")
    out = tmp_path / "shards"
    real_save = np.save
    saves = {"n": 0}

    def full_disk(f, arr, *a, **k):
        saves["n"] += 1
        if saves["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(f, arr, *a, **k)

    monkeypatch.setattr(np, "save", full_disk)
    with pytest.raises(WriteError, match=r"writing .*shards/shard_00002.npy: no space left on device \([\d,]+ bytes "
                                         r"needed, [\d,]+ free on .*\); free some space"):
        encode_corpus(corpus_dir / "en.txt", tok, out, shard_bytes=50_000, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "shard_00000.npy", "shard_00001.npy"]
    monkeypatch.setattr(np, "save", real_save)
    manifest = encode_corpus(corpus_dir / "en.txt", tok, out, shard_bytes=50_000, progress=False)
    assert manifest["complete"] and len(manifest["shards"]) >= 4


def test_task_longer_than_the_model_positions(tmp_path, prepared, corpus_dir):
    from minimodel.config.checks import check_task_fits
    from minimodel.errors import ConfigError

    c = cfg(tmp_path, prepared, corpus_dir)
    with pytest.raises(ConfigError, match=r"tasks.xnli.max_len \(256\) exceeds the model's positions "
                                          r"\(model.max_positions - 2 = 64\): set tasks.xnli.max_len"):
        check_task_fits(c, "xnli")


def test_a_last_checkpoint_without_its_loop_state_is_named_and_passed_over(tmp_path, prepared, corpus_dir, capsys):
    from tests.conftest import tiny_overrides

    args = ["pretrain", str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(tmp_path, corpus_dir, prepared),
            "data.num_workers=0", *stage_overrides(["pretrain"], updates=4, global_batch=8, micro_batch=4,
                                                   ckpt_every=2), "--no-progress"]
    assert main([*args, "pretrain.trainer.stop_at=2"]) == 4
    last = tmp_path / "runs" / "tiny" / "minijoint" / "pretrain" / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint(last)
    del ckpt["loops"]
    last.unlink()  # a hard link to step0000002.ckpt: replace it, keep the step file
    torch.save(ckpt, last)
    capsys.readouterr()
    assert main(args) == 0  # resumed from the step file of the same update, and finished
    err = capsys.readouterr().err
    assert f"{last} cannot resume training: it lacks loops" in err and "Traceback" not in err
    assert f"resuming from the newest intact checkpoint, {last.parent / 'step0000002.ckpt'} (update 2)" in err


def test_a_stop_short_of_the_end_is_not_success_and_nothing_builds_on_it(tmp_path, prepared, corpus_dir, capsys):
    """stop_at exits 4 (not finished), the wall-time cap 3 (requeue); neither writes done.json, and finetuning
    refuses a step-1 model without one (SLURM's afterok must never start a consumer of an unfinished step)."""
    from tests.conftest import tiny_overrides

    base = [str(ROOT / "experiments" / "tiny.yaml"), *tiny_overrides(tmp_path, corpus_dir, prepared),
            "data.num_workers=0", *stage_overrides(["pretrain"], updates=6, global_batch=8, micro_batch=4,
                                                   ckpt_every=2), "--no-progress"]
    run_dir = tmp_path / "runs" / "tiny" / "minijoint" / "pretrain"
    assert main(["pretrain", *base, "pretrain.trainer.stop_at=2"]) == 4
    assert "stopped at stop_at=2 as asked" in capsys.readouterr().err
    assert main(["pretrain", *base, "pretrain.trainer.max_minutes=0.00001"]) == 3  # the cap, at once
    assert not (run_dir / "done.json").exists()
    capsys.readouterr()
    assert main(["finetune", *base, "task=xnli", "seed=1", "tasks.xnli.max_len=64"]) == 2
    assert f"{run_dir} is not complete" in capsys.readouterr().err

"""Two CPU processes (DDP over gloo) train like one process at the same global batch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minimodel.store.checkpoints import load_checkpoint
from tests.conftest import ROOT, stage_overrides, tiny_overrides
from tests.test_pretrain import read_metrics

pytestmark = pytest.mark.slow


def pretrain(tmp: Path, prepared: Path, corpus: Path, *extra: str) -> Path:
    args = [*tiny_overrides(tmp, corpus, prepared, runs_dir=tmp), "model.dropout=0.0", "model.attn_dropout=0.0",
            *stage_overrides(["pretrain"], updates=6, warmup_updates=2, global_batch=8, micro_batch=4, val_every=3,
                             ckpt_every=3, log_every=1), "pretrain.trainer.accelerator=cpu", *extra]
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    p = subprocess.run([sys.executable, "-m", "minimodel.cli", "pretrain", str(ROOT / "experiments" / "tiny.yaml"),
                        *args, "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return tmp / "tiny" / "minijoint" / "pretrain"


def test_two_gloo_processes_match_one_process(tmp_path, prepared, corpus_dir):
    one = pretrain(tmp_path / "one", prepared, corpus_dir, "pretrain.trainer.devices=1")
    two = pretrain(tmp_path / "two", prepared, corpus_dir, "pretrain.trainer.devices=2",
                   "pretrain.trainer.strategy=ddp")
    a = load_checkpoint(one / "checkpoints" / "last.ckpt")
    b = load_checkpoint(two / "checkpoints" / "last.ckpt")
    assert a["global_step"] == b["global_step"] == 6
    for k, v in a["state_dict"].items():
        torch.testing.assert_close(b["state_dict"][k], v, rtol=1e-4, atol=1e-5, msg=k)
    ma, mb = read_metrics(one), read_metrics(two)
    val_a = {s: v["val/loss"] for s, v in ma.items() if "val/loss" in v}
    val_b = {s: v["val/loss"] for s, v in mb.items() if "val/loss" in v}
    assert val_a.keys() == val_b.keys() and len(val_a) == 2
    for s in val_a:
        assert abs(val_a[s] - val_b[s]) < 1e-4, (s, val_a[s], val_b[s])
    # FLOPs and tokens count the global batch, whatever the number of processes
    assert ma[5]["flops/cumulative"] == mb[5]["flops/cumulative"]
    assert ma[5]["train/tokens"] == mb[5]["train/tokens"] == 6 * 8 * 64

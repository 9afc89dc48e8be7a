"""The stage runner and the systems registry: finetuning resumes exactly after kill -9, every rank and every
requeue of a run logs to one wandb run, systems are validated against the registry, light commands stay light."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minimodel.errors import ConfigError
from minimodel.experiment import load_experiment
from minimodel.store.checkpoints import load_checkpoint
from minimodel.training.loggers import wandb_run_id
from tests.conftest import ROOT, stage_overrides, tiny_overrides
from tests.test_reliability import cli, kill_when, mid_way, run_to_end

EXP = str(ROOT / "experiments" / "demo.yaml")


def base(tmp: Path, prepared: Path, corpus: Path) -> list[str]:
    return [*tiny_overrides(tmp, corpus, prepared, runs_dir=tmp), "system=bl_base", "model.mini_heads=[]",
            *stage_overrides(["pretrain"], updates=6, global_batch=8, micro_batch=4, warmup_updates=2, ckpt_every=6,
                             val_every=6),
            f"tasks.lohelp.source={ROOT / 'data/demo/task/lohelp'}", "tasks.lohelp.max_train_examples=960",
            "finetune.epochs=1", "finetune.batch_size=8", "finetune.micro_batch=8", "finetune.trainer.ckpt_every=10",
            "finetune.trainer.val_every=40", "finetune.trainer.log_every=1", "task=lohelp", "seed=1"]


def losses(run_dir: Path) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}


@pytest.mark.slow
def test_finetuning_killed_twice_then_resumed_equals_an_uninterrupted_run(tmp_path, prepared, corpus_dir):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    for root in (straight, killed):
        run_to_end("pretrain", EXP, *base(root, prepared, corpus_dir))
    run_to_end("finetune", EXP, *base(straight, prepared, corpus_dir))
    run_dir = killed / "demo" / "bl_base" / "finetune" / "lohelp" / "seed1"
    ref_dir = straight / "demo" / "bl_base" / "finetune" / "lohelp" / "seed1"
    assert max(losses(ref_dir)) == 119  # 960 examples / 8 per update, one epoch

    for step in (20, 70):
        kill_when(cli("finetune", EXP, *base(killed, prepared, corpus_dir)), mid_way(run_dir, step, 10))
        assert not (run_dir / "done.json").exists() and not (run_dir / "model.pt").exists()
    run_to_end("finetune", EXP, *base(killed, prepared, corpus_dir))
    assert losses(run_dir) == losses(ref_dir)
    a, b = load_checkpoint(ref_dir / "model.pt"), load_checkpoint(run_dir / "model.pt")
    assert a["english"] == b["english"]
    assert all(torch.equal(a["body_state"][k], b["body_state"][k]) for k in a["body_state"])
    assert all(torch.equal(a["head_state"][k], b["head_state"][k]) for k in a["head_state"])


@pytest.mark.slow
def test_two_ranks_and_a_requeue_log_to_one_wandb_run(tmp_path, prepared, corpus_dir):
    """A 2-process DDP pretraining with wandb offline, stopped and resumed: one wandb run, whose id is the
    run directory's (the same on every rank), and no per-rank id files."""
    args = [*base(tmp_path, prepared, corpus_dir), "logging.wandb=offline", "pretrain.trainer.devices=2",
            "pretrain.trainer.strategy=ddp", "pretrain.trainer.accelerator=cpu", "pretrain.optim.updates=8",
            "pretrain.trainer.ckpt_every=4"]
    env = {**{k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"},  # each call its own service,
           "WANDB_MODE": "offline", "WANDB_SILENT": "true", "PYTHONUNBUFFERED": "1"}  # as two SLURM jobs have
    run_dir = tmp_path / "demo" / "bl_base" / "pretrain"
    for extra in (["pretrain.trainer.stop_at=4"], []):  # the second call resumes, as a requeued job does
        p = subprocess.run([sys.executable, "-m", "minimodel.cli", "pretrain", EXP, *args, *extra, "--no-progress"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == (4 if extra else 0), p.stdout + p.stderr  # 4: stopped at stop_at, not finished
    assert (run_dir / "done.json").exists() and not (run_dir / "wandb_id.txt").exists()
    runs = sorted(d.name for d in (run_dir / "wandb").glob("offline-run-*"))
    expected = wandb_run_id(run_dir)
    assert len(runs) == 2 and all(r.endswith(f"-{expected}") for r in runs), runs  # two starts, one run id
    # rank 1 computes the same id: it derives from the path, whatever the process
    code = (f"from pathlib import Path; from minimodel.training.loggers import wandb_run_id; "
            f"print(wandb_run_id(Path({str(run_dir)!r})))")
    rank1 = subprocess.run([sys.executable, "-c", code], env={**env, "RANK": "1", "LOCAL_RANK": "1"}, cwd=ROOT,
                           capture_output=True, text=True, check=True)
    assert rank1.stdout.strip() == expected


def test_unknown_system_lists_the_registry(tmp_path):
    with pytest.raises(ConfigError, match=r"system must be one of bl_base, bl_small, minijoint, minipost, got 'minijiont'"):
        load_experiment(ROOT / "experiments" / "tiny.yaml", ["system=minijiont"])


def test_a_system_that_shares_its_step_1_refuses_to_pretrain(tmp_path):
    from minimodel.stages.pretrain import run_pretrain

    cfg = load_experiment(ROOT / "experiments" / "demo.yaml", ["system=minipost", f"runs_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"system minipost has no step 1 of its own: its primary model is .*bl_base"):
        run_pretrain(cfg, progress_bar=False)


def test_light_commands_import_neither_torch_nor_lightning(tmp_path):
    code = (
        "import sys\n"
        "from minimodel.cli import main\n"
        f"assert main(['flops', {EXP!r}]) == 0\n"
        f"assert main(['report', {EXP!r}, 'runs_dir={tmp_path}']) == 0\n"
        f"assert main(['submit', {EXP!r}, 'runs_dir={tmp_path}', '--dry-run']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


FLOPS_DEMO_MINIJOINT = """\
demo / minijoint: h=64, s=64, V=2000, p=0.15, 2 target languages

| step | formula | layers | updates | batch | EFLOPs | V100-days |
|---|---|---:|---:|---:|---:|---:|
| 1 pretrain | A1 + 1 head | 4 | 2,000 | 32 | 6.611e-06 | 2.551e-06 |
| 2 adapt (per language) | A3 | 2 | 400 | 32 | 4.722e-07 | 1.822e-07 |
| 2 adapt (2 languages) | A3 | 2 | 800 | 32 | 9.444e-07 | 3.643e-07 |
"""
# by hand: A1 = 3 U B (4 x 7,340,032 + 2 x 2,536,243.2) = 6.611e12 FLOPs at U=2000, B=32;
# A3 over 2 layers = U B (2 x 2 x 7,340,032 + 2 x 2,536,243.2 + 0.15 x 2 x 64 x 64 x 2000) = 4.722e11 at U=400


def test_flops_command_prints_the_cost_table(capsys):
    from minimodel.cli import main

    assert main(["flops", EXP, "system=minijoint", "model.mini_heads=[2]"]) == 0
    assert capsys.readouterr().out == FLOPS_DEMO_MINIJOINT
    assert main(["flops", EXP, "system=minipost"]) == 0
    out = capsys.readouterr().out
    assert "| 1 pretrain (BL_BASE, shared) | A1 | 4 |" in out and "| 1b bridge | A4 | 2 | 300 | 32 |" in out

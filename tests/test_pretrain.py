import csv
from pathlib import Path

import pytest
import torch

from minimodel.stages.pretrain import run_pretrain
from minimodel.store.checkpoints import load_checkpoint
from tests.conftest import stage_overrides, tiny_config

pytestmark = pytest.mark.slow


def read_metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    """Last row per step for each metric (a resumed run appends)."""
    out: dict[int, dict[str, float]] = {}
    with open(run_dir / "metrics.csv") as f:
        for row in csv.DictReader(f):
            step = int(row["step"])
            out.setdefault(step, {}).update({k: float(v) for k, v in row.items() if v not in ("", None) and k != "step"})
    return out


def rows(run_dir: Path) -> list[tuple[str, ...]]:
    """Every row of metrics.csv, the columns that do not depend on timing."""
    with open(run_dir / "metrics.csv") as f:
        return [tuple(r.get(k, "") for k in ("step", "train/loss", "val/loss", "flops/cumulative", "train/lr"))
                for r in csv.DictReader(f)]


def config(tmp: Path, prepared: Path, corpus: Path, *extra: str):
    stage = stage_overrides(["pretrain"], updates=30, warmup_updates=5, global_batch=8, micro_batch=4, lr=2e-3,
                            ckpt_every=10, val_every=10, log_every=2)
    return tiny_config(tmp, corpus, *stage, *extra, prepared=prepared)


def test_tiny_minijoint_learns_checkpoints_and_resumes_exactly(tmp_path, prepared, corpus_dir):
    straight = run_pretrain(config(tmp_path / "a", prepared, corpus_dir), progress_bar=False).run_dir
    ckpts = sorted(p.name for p in (straight / "checkpoints").glob("*.ckpt"))
    assert ckpts == ["last.ckpt", "step0000010.ckpt", "step0000020.ckpt", "step0000030.ckpt"]
    assert (straight / "done.json").exists() and (straight / "config.yaml").exists()
    m = read_metrics(straight)
    train_steps = sorted(s for s, v in m.items() if "train/loss" in v)
    first, last = m[train_steps[0]], m[train_steps[-1]]
    assert last["train/loss"] < first["train/loss"] - 0.5
    assert last["train/loss_mini"] < first["train/loss_mini"] - 0.5
    assert any("val/ppl_mini" in v for v in m.values())
    final = m[max(s for s, v in m.items() if "flops/cumulative" in v)]
    ckpt = load_checkpoint(straight / "checkpoints" / "last.ckpt")
    assert ckpt["minimodel"]["step"] == 30 and ckpt["minimodel"]["flops"] == pytest.approx(final["flops/cumulative"])

    # the same run interrupted twice and resumed: identical losses and bit-identical weights
    b = tmp_path / "b"
    run_pretrain(config(b, prepared, corpus_dir, "pretrain.trainer.stop_at=7"), progress_bar=False)
    resumed_dir = run_pretrain(config(b, prepared, corpus_dir, "pretrain.trainer.stop_at=20"), progress_bar=False).run_dir
    assert not (resumed_dir / "done.json").exists()
    run_pretrain(config(b, prepared, corpus_dir), progress_bar=False)
    assert (resumed_dir / "done.json").exists()
    mb = read_metrics(resumed_dir)
    for step in train_steps:
        assert mb[step]["train/loss"] == m[step]["train/loss"], step
        assert mb[step]["train/loss_mini"] == m[step]["train/loss_mini"], step
    # row for row the uninterrupted run's log: no extra row for the updates the stops came at (7 is on neither
    # the logging nor the validation grid; 20 is on both), none with stale FLOPs
    assert rows(resumed_dir) == rows(straight)
    wa = load_checkpoint(straight / "checkpoints" / "last.ckpt")["state_dict"]
    wb = load_checkpoint(resumed_dir / "checkpoints" / "last.ckpt")["state_dict"]
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k

    # a finished stage is skipped
    run_pretrain(config(b, prepared, corpus_dir), progress_bar=False)
    assert load_checkpoint(resumed_dir / "checkpoints" / "last.ckpt")["minimodel"]["step"] == 30

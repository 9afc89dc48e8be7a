"""Files are data, never code: a crafted checkpoint is refused before anything in it runs; a full disk
while checkpointing is a clear error that leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from minimodel.cli import main
from minimodel.errors import WriteError
from minimodel.store.checkpoints import (
    CheckpointError,
    atomic_torch_save,
    load_adaptation,
    load_checkpoint,
    load_finetuned,
    load_trained_model,
)
from minimodel.systems import stage_plan
from tests.conftest import ROOT, stage_overrides, tiny_config, tiny_overrides


class RunsCode:
    """Unpickling this runs a shell command (what a crafted checkpoint would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.marker}",)


def crafted(path: Path, marker: Path, like: dict) -> Path:
    """A checkpoint shaped like ``like`` with one object that runs code when unpickled."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**like, "payload": RunsCode(marker)}, path)
    return path


LOADERS = {"training checkpoint": load_trained_model, "adaptation checkpoint": load_adaptation,
           "finetuned model": load_finetuned}


@pytest.mark.parametrize("what", LOADERS)
def test_a_crafted_file_is_refused_and_runs_nothing(tmp_path, what):
    marker = tmp_path / "ran"
    path = crafted(tmp_path / "evil.pt", marker, {"global_step": 1, "format": 2})
    with pytest.raises(CheckpointError, match=rf"refusing to load {path}: it holds a Python object \(posix.system\)"):
        LOADERS[what](path)
    assert not marker.exists()


def test_a_crafted_last_ckpt_in_a_run_directory_is_refused(tmp_path, prepared, corpus_dir, capsys):
    overrides = [*tiny_overrides(tmp_path, corpus_dir, prepared=prepared), *stage_overrides(["pretrain"], updates=4)]
    cfg = tiny_config(tmp_path, corpus_dir, *stage_overrides(["pretrain"], updates=4), prepared=prepared)
    marker = tmp_path / "ran"
    crafted(stage_plan(cfg, "adapt").runs.pretrain / "checkpoints" / "last.ckpt", marker, {"global_step": 2})
    assert main(["pretrain", str(ROOT / "experiments" / "tiny.yaml"), *overrides, "--no-progress"]) == 2
    assert "refusing to load" in capsys.readouterr().err
    assert not marker.exists()


def test_a_crafted_bridge_source_is_refused(tmp_path, prepared, corpus_dir, capsys):
    marker = tmp_path / "ran"
    source = crafted(tmp_path / "public.ckpt", marker, {"state_dict": {}, "minimodel": {}})
    overrides = [*tiny_overrides(tmp_path, corpus_dir, prepared=prepared), "system=minipost", "model.mini_heads=[]",
                 "bridge.depth=2", f"bridge.source={source}"]
    assert main(["bridge", str(ROOT / "experiments" / "tiny.yaml"), *overrides, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"refusing to load {source}" in err and "Traceback" not in err
    assert not marker.exists()


def test_checkpoints_written_by_training_load_as_plain_data(tmp_path):
    """What ScheduledCheckpoints stores (RNG states) passes the safe unpickler, and restores exactly."""
    import numpy as np

    from minimodel.store.checkpoints import rng_state, set_rng_state

    path = tmp_path / "rng.ckpt"
    atomic_torch_save({"rng": rng_state()}, path)
    expected = (np.random.rand(3), torch.rand(3))
    set_rng_state(load_checkpoint(path)["rng"])
    assert (np.random.rand(3) == expected[0]).all() and torch.equal(torch.rand(3), expected[1])


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB tmpfs (needs root; skipped where mounting is not allowed)."""
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_really_full_disk_while_checkpointing(small_disk):
    target = small_disk / "last.ckpt"
    atomic_torch_save({"w": torch.zeros(1000)}, target)
    before = target.read_bytes()
    with pytest.raises(WriteError, match=rf"writing {target}: no space left on device \(8,000,000 bytes needed, "
                                         rf"[\d,]+ free on {small_disk}\); free some space"):
        atomic_torch_save({"w": torch.zeros(2_000_000)}, target)  # 8 MB on a 1 MiB disk
    assert sorted(p.name for p in small_disk.iterdir()) == ["last.ckpt"]  # no hidden temporary file left
    assert target.read_bytes() == before

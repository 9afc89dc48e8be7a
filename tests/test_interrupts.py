"""Ctrl-C (issue 25, part 3): one policy, documented in errors.py and docs/running.md (exit codes, Ctrl-C).

A training stage takes the first SIGINT like SIGTERM (finish the update, checkpoint, exit 3) and a second one as
"stop now" (exit 130, the last checkpoint kept); prepare, evaluate and every other command stop at once with
``interrupted`` and exit 130. Never a traceback, never a half-written file; a rerun resumes and ends where an
uninterrupted run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minimodel.store import atomic
from minimodel.store.checkpoints import load_checkpoint
from tests.conftest import ROOT, TINY_STAGE, stage_overrides, tiny_overrides

pytestmark = pytest.mark.slow

EXP = str(ROOT / "experiments" / "tiny.yaml")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}

DRIVER = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal starts it (not SIG_IGN inherited from pytest)
from minimodel.cli import main
{patch}
sys.exit(main(sys.argv[1:]))
"""
"""``minimodel`` in a subprocess that sends itself SIGINT at a chosen point (``patch``): a real signal, on time."""

AT_UPDATE = """
from minimodel.training.callbacks import ScheduledCheckpoints
_end = ScheduledCheckpoints.on_train_batch_end
def on_train_batch_end(self, trainer, *args):
    _end(self, trainer, *args)
    if trainer.global_step == 3 and not getattr(self, "_pressed", False):
        self._pressed = True
        for _ in range({presses}):
            os.kill(os.getpid(), signal.SIGINT)
ScheduledCheckpoints.on_train_batch_end = on_train_batch_end
"""

IN_ENCODING = """
import minimodel.data.encode as encode
_chunks = encode.iter_raw_chunks
def iter_raw_chunks(*args, **kwargs):  # Ctrl-C while the main process reads the corpus for the encoding processes
    import time
    for chunk in _chunks(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # Ctrl-C lands here, in the reading
        yield chunk
encode.iter_raw_chunks = iter_raw_chunks
"""


def driven(patch: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", DRIVER.format(patch=patch), *args, "--no-progress"], cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=600)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minimodel.cli", *args, "--no-progress"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)


def pretrain_args(root: Path, prepared: Path, corpus: Path, *extra: str) -> list[str]:
    return ["pretrain", EXP, *tiny_overrides(root, corpus, prepared, runs_dir=root),
            *stage_overrides(["pretrain"], updates=6, **TINY_STAGE, ckpt_every=2, val_every=6, log_every=1), *extra]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, prepared: Path, corpus_dir: Path) -> dict:
    root = tmp_path_factory.mktemp("straight")
    r = cli(*pretrain_args(root, prepared, corpus_dir))
    assert r.returncode == 0, r.stderr
    return weights(root / "tiny" / "minijoint" / "pretrain")


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_in_training_then_a_rerun_ends_where_an_uninterrupted_run_ends(tmp_path, prepared, corpus_dir,
                                                                             uninterrupted, presses):
    args = pretrain_args(tmp_path, prepared, corpus_dir)
    run_dir = tmp_path / "tiny" / "minijoint" / "pretrain"
    r = driven(AT_UPDATE.format(presses=presses), *args)
    assert "Traceback" not in r.stderr, r.stderr
    assert "[minimodel] Ctrl-C: stopping after this update, with a checkpoint (exit 3; rerun to resume); Ctrl-C " \
           "again stops at once" in r.stderr
    if presses == 1:  # finish the update, checkpoint, exit 3
        assert r.returncode == 3, r.stderr
        assert "pretrain: stopped on SIGINT after writing a checkpoint; rerun the same command to resume" in r.stderr
        assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 4
    else:  # at once: exit 130, the last scheduled checkpoint kept
        assert r.returncode == 130, r.stderr
        assert ("[minimodel] pretrain: interrupted (Ctrl-C): stopped at once; every file it wrote is whole (none is "
                "left half-written): rerun the same command to go on") in r.stderr
        assert load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 2
    assert not (run_dir / "done.json").exists()
    assert atomic.leftovers(tmp_path) == []
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stderr
    resumed = weights(run_dir)
    assert resumed.keys() == uninterrupted.keys() and all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)


def test_ctrl_c_from_a_terminal_during_training_checkpoints_and_exits_3(tmp_path, prepared, corpus_dir):
    """SIGINT to the whole process group, as a terminal sends it, data workers included (they leave it to the main
    process): the stage checkpoints and exits 3; the rerun resumes from there."""
    args = ["pretrain", EXP, *tiny_overrides(tmp_path, corpus_dir, prepared, runs_dir=tmp_path),
            *stage_overrides(["pretrain"], updates=400, **TINY_STAGE, ckpt_every=4, val_every=400, log_every=1),
            "data.num_workers=1"]
    run_dir = tmp_path / "tiny" / "minijoint" / "pretrain"
    p = subprocess.Popen([sys.executable, "-m", "minimodel.cli", *args, "--no-progress"], cwd=ROOT, env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    start = time.monotonic()
    while not (run_dir / "metrics.csv").exists() and p.poll() is None and time.monotonic() - start < 300:
        time.sleep(0.1)
    time.sleep(0.5)
    os.killpg(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 3, out
    assert "Traceback" not in out
    assert "pretrain: stopped on SIGINT after writing a checkpoint; rerun the same command to resume" in out
    step = int(load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["global_step"])
    assert 0 < step < 400 and (run_dir / "checkpoints" / f"step{step:07d}.ckpt").exists()
    assert not (run_dir / "done.json").exists() and atomic.leftovers(tmp_path) == []
    r = cli(*args, f"pretrain.trainer.stop_at={step + 2}")
    assert r.returncode == 4, r.stderr
    assert f"resuming from {run_dir / 'checkpoints' / 'last.ckpt'} (update {step})" in r.stderr


def test_ctrl_c_in_prepare_is_a_clean_exit_130_and_the_rerun_finishes(tmp_path, prepared, corpus_dir):
    """SIGINT while the corpus is encoded (the tokenizer is trained): ``interrupted``, exit 130, no partial file; the
    rerun keeps the tokenizer and writes the same shards as an uninterrupted prepare."""
    args = ["prepare", EXP, *tiny_overrides(tmp_path, corpus_dir), "--langs=en"]
    r = driven(IN_ENCODING, *args)
    assert r.returncode == 130, r.stderr
    assert "Traceback" not in r.stderr
    assert ("[minimodel] prepare: interrupted (Ctrl-C): stopped at once; every file it wrote is whole (none is left "
            "half-written): rerun the same command to go on") in r.stderr
    ours, theirs = tmp_path / "prepared" / "en", prepared / "prepared" / "en"
    assert (ours / "spm.model").read_bytes() == (theirs / "spm.model").read_bytes()
    assert not (ours / "shards" / "manifest.json").exists()
    assert atomic.leftovers(tmp_path) == []
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    assert "tokenizer" in r.stderr and "exists" in r.stderr
    files = sorted(p.name for p in (theirs / "shards").iterdir())
    assert sorted(p.name for p in (ours / "shards").iterdir()) == files
    for name in files:
        if name.endswith(".npy"):
            assert (ours / "shards" / name).read_bytes() == (theirs / "shards" / name).read_bytes(), name

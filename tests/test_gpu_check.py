"""`make gpu-check` (scripts/gpu_check.py): it skips cleanly where no CUDA device exists, and its verdicts and
summary are right. What it checks on a GPU is described in docs/benchmarks.md."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


gpu_check = load_script()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: gpu-check would run for real")
def test_without_cuda_it_says_why_exits_0_and_writes_nothing(tmp_path):
    default = gpu_check.OUT
    before = default.stat().st_mtime_ns if default.exists() else None
    out = tmp_path / "check.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("gpu-check: skipped: torch ")
    assert ("built without CUDA" in p.stdout) or ("finds no CUDA device" in p.stdout)
    assert "Nothing was checked and nothing written" in p.stdout
    assert not out.exists()
    assert (default.stat().st_mtime_ns if default.exists() else None) == before


def test_an_unknown_check_is_refused_by_name():
    p = subprocess.run([sys.executable, str(SCRIPT), "--only", "chain,speed"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "unknown check(s) speed" in p.stderr


def test_resume_is_held_to_the_gpus_own_noise():
    assert gpu_check.resume_verdict(3e-4, 1e-4) == (True, pytest.approx(1e-3))
    assert gpu_check.resume_verdict(2e-3, 1e-4) == (False, pytest.approx(1e-3))  # beyond 10x the noise
    assert gpu_check.resume_verdict(5e-7, 0.0) == (True, 1e-6)  # a deterministic GPU: float-exact or nearly
    assert gpu_check.resume_verdict(1e-5, 0.0)[0] is False
    assert gpu_check.resume_verdict(math.nan, 1e-4)[0] is False


def test_memory_is_held_to_a_band_around_the_plan():
    assert gpu_check.memory_verdict(100, 100) == (True, 1.0)
    assert gpu_check.memory_verdict(110, 100)[0] is True and gpu_check.memory_verdict(111, 100)[0] is False
    assert gpu_check.memory_verdict(75, 100)[0] is True and gpu_check.memory_verdict(74, 100)[0] is False


def test_distances_between_runs():
    a = {"w": torch.tensor([3.0, 4.0]), "step": torch.tensor(7)}
    assert gpu_check.relative_distance(a, a) == 0.0
    b = {"w": torch.tensor([3.0, 4.5]), "step": torch.tensor(7)}
    assert gpu_check.relative_distance(a, b) == pytest.approx(0.1)  # ||(0, 0.5)|| / ||(3, 4)||
    assert gpu_check.relative_distance(a, {"v": a["w"]}) == math.inf
    assert gpu_check.loss_distance({1: 2.0, 2: 1.5}, {1: 2.0, 2: 1.4, 3: 9.0}) == pytest.approx(0.1)
    assert gpu_check.loss_distance({1: 2.0}, {2: 2.0}) == math.inf


def test_summary_table_of_a_result():
    row = {"experiment": "minijoint", "stage": "pretrain", "micro_batch": 32, "seq_len": 512, "measured": 9 * 2**30,
           "predicted": 10 * 2**30, "ratio": 0.9, "ok": True}
    bad = {**row, "stage": "adapt", "measured": 12 * 2**30, "ratio": 1.2, "ok": False}
    checks = {"chain": {"status": "ok", "summary": "7/7 steps exit 0"}, "resume": {"status": "skipped"},
              "bench": {"status": "failed", "summary": "run_all.py exit 1"},
              "memory": {"status": "failed", "rows": [row, bad], "summary": "2 stages"}}
    result = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "status": gpu_check.status_of(checks),
              "checks": checks}
    assert result["status"] == "failed: bench, memory"
    table = gpu_check.summary_table(result).splitlines()
    assert table[0] == "gpu-check on NVIDIA H100 80GB HBM3 (torch 2.13.0): failed: bench, memory"
    assert any(line.startswith("chain    ok       7/7 steps exit 0") for line in table)
    assert any(line.startswith("resume   skipped") for line in table)
    memory = [line for line in table if line.startswith("minijoint ")]
    assert memory[0].split() == ["minijoint", "pretrain", "32", "512", "9.00", "10.00", "0.900", "ok"]
    assert memory[1].endswith("1.200  OUTSIDE 0.75-1.1")
    assert gpu_check.status_of({"chain": {"status": "ok"}, "bench": {"status": "skipped"}}) == "ok"

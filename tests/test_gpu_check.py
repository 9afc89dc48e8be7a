"""`make gpu-check` (scripts/gpu_check.py): it skips cleanly where no CUDA device exists, and its verdicts and
summary are right. What it checks on a GPU is described in docs/benchmarks.md."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

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


def test_a_check_left_without_time_is_not_run_and_said_so():
    status = gpu_check.status_of
    assert status({"chain": {"status": "ok"}, "resume": {"status": "not run"}}) == "incomplete: not run: resume"
    assert status({"chain": {"status": "failed"}, "bench": {"status": "not run"}}) == "failed: chain (not run: bench)"
    assert status({"chain": {"status": "cut short"}, "memory": {"status": "ok"}}, ["bench"]) == \
        "incomplete: cut short: chain; still to run: bench"
    assert status({"chain": {"status": "failed"}}, ["memory", "resume"]) == \
        "failed: chain (still to run: memory, resume)"  # a failure known before a stop from outside is not hidden
    assert status({}, ["chain"]) == "incomplete: still to run: chain"


def test_a_check_stopped_by_the_budget_is_cut_short_not_failed():
    def stopped_at(seconds):
        def fn():
            raise subprocess.TimeoutExpired(["minimodel"], seconds)
        return fn

    cut = gpu_check.run_check("chain", stopped_at(30.0))
    assert cut["status"] == "cut short" and "the --budget-s ran out" in cut["summary"]
    own = gpu_check.run_check("chain", stopped_at(float(gpu_check.TIMEOUT_S["chain"])))  # its own limit: a failure
    assert own["status"] == "failed" and own["summary"] == f"timed out after {gpu_check.TIMEOUT_S['chain']} s"


def test_a_stopped_subprocess_takes_its_children_with_it(tmp_path):
    """`minimodel run` starts each step as a process of its own, run_all.py each benchmark: at a time limit none may
    go on holding the GPU while the next check runs."""
    pid_file, log = tmp_path / "child.pid", tmp_path / "run.log"
    cmd = ["bash", "-c", f"sleep 60 & echo $! > {pid_file}; echo started; wait"]
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        gpu_check.run_limited(cmd, log, timeout=2.0)
    assert time.monotonic() - t0 < 30 and log.read_text() == "started\n"
    child = int(pid_file.read_text())
    for _ in range(200):  # gone, or a zombie waiting for init to reap it: not running either way
        try:
            state = Path(f"/proc/{child}/stat").read_text().split(")")[-1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"the child {child} still runs (state {state})")
    assert gpu_check.run_limited(["bash", "-c", "exit 3"], log, timeout=30).returncode == 3


def test_subprocess_limits_are_cut_to_the_budget_left(monkeypatch):
    monkeypatch.setattr(gpu_check, "_DEADLINE", [])
    assert gpu_check.limit("chain") == gpu_check.TIMEOUT_S["chain"] and gpu_check.time_left() == math.inf
    now = 1000.0
    monkeypatch.setattr(gpu_check, "_now", lambda: now)
    monkeypatch.setattr(gpu_check, "_DEADLINE", [now + 100.0])
    assert gpu_check.limit("chain") == 100.0 and gpu_check.limit("bench") == 100.0
    monkeypatch.setattr(gpu_check, "_DEADLINE", [now + 1000.0])
    assert gpu_check.limit("resume") == gpu_check.TIMEOUT_S["resume"]
    monkeypatch.setattr(gpu_check, "_DEADLINE", [now - 5.0])
    assert gpu_check.limit("chain") == 1.0  # never 0 or below: subprocess would refuse it


def test_with_a_budget_the_json_and_logs_are_written_after_every_check(tmp_path, monkeypatch):
    """A lent machine's call can be stopped from outside at its limit: what was measured before must be on disk."""
    out, logs = tmp_path / "out" / "gpu_check.json", tmp_path / "out" / "logs"
    seen = {}
    now = [0.0]

    def chain(tmp, device):  # the JSON is there before the first check ends
        seen["before"] = json.loads(out.read_text())
        tmp.mkdir(parents=True)
        (tmp / "chain.log").write_text("the chain's log\n")
        return {"status": "failed", "summary": "pretrain exit 1"}

    def memory(device):  # the moment a stop from outside would come: the chain's result is already written
        seen["json"] = json.loads(out.read_text())
        seen["log"] = (logs / "chain.log").read_text()
        now[0] = 100.0  # it takes 100 s of the 120: 20 left, under MIN_LEFT_S
        return {"status": "ok", "summary": "6 stages"}

    def resume(tmp, device):
        raise AssertionError("resume must not start with no time left")

    monkeypatch.setattr(gpu_check, "_now", lambda: now[0])
    monkeypatch.setattr(gpu_check, "check_chain", chain)
    monkeypatch.setattr(gpu_check, "check_memory", memory)
    monkeypatch.setattr(gpu_check, "check_resume", resume)
    rc = gpu_check.main(["--device", "cpu", "--only", "chain,memory,resume", "--budget-s", "120", "--out", str(out),
                         "--logs", str(logs)])
    assert gpu_check._DEADLINE == []  # the budget ends with the run
    assert seen["before"]["status"] == "incomplete: still to run: chain, memory, resume"
    assert seen["before"]["checks"] == {}
    assert seen["json"]["status"] == "failed: chain (still to run: memory, resume)"  # bench: not asked for
    assert list(seen["json"]["checks"]) == ["chain"] and seen["json"]["checks"]["chain"]["status"] == "failed"
    assert seen["log"] == "the chain's log\n"
    final = json.loads(out.read_text())
    assert rc == 1 and final["budget_s"] == 120
    assert final["checks"]["bench"] == {"status": "skipped", "summary": "--only"}
    assert final["checks"]["memory"]["status"] == "ok"
    summary = final["checks"]["resume"]["summary"]
    assert final["checks"]["resume"]["status"] == "not run" and summary.startswith("20 s of the --budget-s 120 left")
    assert final["status"] == "failed: chain (not run: resume)"
    assert not list(out.parent.glob("*.part"))


def test_a_budget_of_nothing_is_refused():
    p = subprocess.run([sys.executable, str(SCRIPT), "--budget-s", "0"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "--budget-s: expected a number of seconds above 0" in p.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: gpu-check would run for real")
def test_the_device_script_installs_the_carried_wheels_and_runs_from_the_tree(tmp_path):
    """scripts/device_gpu_check.sh as a lent machine runs it, here on its no-CUDA side: the wheels it is given are
    installed into its site folder and put on the path, the versions it runs with are recorded in $OUT, minimodel is
    imported from this checkout, and no CUDA device is a failure there (exit 2), not gpu-check's skip."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / "carriedmod-1.0-py3-none-any.whl", "w") as z:  # a wheel by hand: what pip reads
        z.writestr("carriedmod.py", "VALUE = 42\n")
        z.writestr("carriedmod-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: carriedmod\nVersion: 1.0\n")
        z.writestr("carriedmod-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
                                                     "Tag: py3-none-any\n")
        z.writestr("carriedmod-1.0.dist-info/RECORD", "")
    out, site = tmp_path / "out", tmp_path / "site"
    script = ["bash", str(ROOT / "scripts" / "device_gpu_check.sh")]
    env = {**os.environ, "PYTHON": sys.executable, "WHEELS": str(wheels), "SITE": str(site), "OUT": str(out)}
    p = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stdout + p.stderr
    assert (site / "carriedmod.py").read_text() == "VALUE = 42\n"
    versions = (out / "versions.txt").read_text()
    assert f"minimodel.cli ok {ROOT / 'minimodel' / 'cli.py'}" in versions and "MISSING" not in versions
    assert (out / "nvidia-smi.txt").is_file() and not (out / "import.txt").exists()
    assert "gpu-check: no CUDA device: torch" in (out / "gpu_check.log").read_text()
    assert "scripts/gpu_check.py exit 2" in p.stdout and not (out / "gpu_check.json").exists()

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    p = subprocess.run(script, cwd=tmp_path, env={**env, "WHEELS": str(bad)}, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 3 and f"the wheels in {bad} did not install" in p.stderr

    blocked = tmp_path / "blocked"  # a machine without omegaconf, and no wheel carried for it
    blocked.mkdir()
    (blocked / "omegaconf.py").write_text("raise ImportError('omegaconf: not on this machine')\n")
    p = subprocess.run(script, cwd=tmp_path, env={**env, "WHEELS": str(tmp_path / "none"), "PYTHONPATH": str(blocked)},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 4, p.stdout + p.stderr
    assert "no wheels in" in p.stderr and "minimodel cannot be imported" in p.stderr and "omegaconf" in p.stderr

"""`minimodel plan` and the launchers' cards: the plan per stage against each GPU launcher's memory
(``gpu_memory_gib``), `submit` warns but submits, and neither command imports torch. The formula: test_memory.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_plan_command_prints_the_plan_and_warns(capsys):
    from minimodel.cli import main

    exp = str(ROOT / "experiments" / "minijoint.yaml")
    assert main(["plan", exp, "--launcher", "v100", "pretrain.optim.micro_batch=128"]) == 0
    captured = capsys.readouterr()
    assert "paper / minijoint on launcher v100 (31.7 GiB per GPU)" in captured.out
    pretrain = next(line for line in captured.out.splitlines() if line.startswith("| pretrain |"))
    cells = [c.strip() for c in pretrain.split("|")[1:-1]]
    assert cells[2:6] == ["8", "128", "512", "16-mixed"]  # 2 nodes x 4 GPUs; the launcher's precision=16-mixed
    assert cells[-2:] == ["**no**", "64 (19.84)"]
    assert "pretrain.optim.micro_batch=64 would" in captured.err
    assert main(["plan", exp, "--launcher", "a100"]) == 0
    out = capsys.readouterr()
    assert "79 GiB per GPU" in out.out and "**no**" not in out.out and "WARNING" not in out.err


def test_submit_warns_but_submits(tmp_path, capsys):
    from minimodel.cluster.launch import submit

    exp = str(ROOT / "experiments" / "minijoint.yaml")
    overrides = ["target_langs=[de]", "finetune.tasks=[xnli]", "finetune.seeds=[1]", f"runs_dir={tmp_path}",
                 f"data.prepared_dir={tmp_path / 'prepared'}", f"data.corpus_dir={ROOT / 'data' / 'demo' / 'corpus'}",
                 "adapt.optim.micro_batch=256"]
    launcher = tmp_path / "small.yaml"
    launcher.write_text("gpu_memory_gib: 16\nstages:\n  adapt: {time: '01:00:00', nodes: 1, gpus_per_node: 8}\n")
    jobs = submit(exp, overrides, launcher=str(launcher), dry_run=True)
    assert [name for name, _ in jobs] == ["prepare-en", "prepare-de", "pretrain", "finetune-xnli-s1", "adapt-de",
                                          "evaluate-de", "report"]  # a warning, not a refusal
    err = capsys.readouterr().err
    warning, = [line for line in err.splitlines() if "WARNING" in line]
    assert "WARNING: adapt needs about" in warning and "adapt.optim.micro_batch=256" in warning
    assert "adapt.optim.micro_batch=128 would" in warning and "16 GiB" in warning


def test_launchers_state_their_card(tmp_path):
    from minimodel.cluster.launcher import LauncherConfigError, launcher_path, load_launcher

    exp = ROOT / "experiments" / "minijoint.yaml"
    cards = {name: load_launcher(launcher_path(name, exp)).gpu_memory_gib for name in ("a100", "h100", "v100", "local")}
    assert cards == {"a100": 79, "h100": 79, "v100": 31.7, "local": 0}
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu_memory_gib: -8\n")
    with pytest.raises(LauncherConfigError, match=r"bad.yaml: gpu_memory_gib must be the memory of one GPU in GiB"):
        load_launcher(bad)


def test_plan_and_submit_import_neither_torch_nor_lightning(tmp_path: Path):
    exp = str(ROOT / "experiments" / "minijoint.yaml")
    code = (
        "import sys\n"
        "from minimodel.cli import main\n"
        f"assert main(['plan', {exp!r}, '--launcher', 'a100']) == 0\n"
        f"assert main(['submit', {exp!r}, 'runs_dir={tmp_path}', '--launcher', 'a100', '--dry-run']) == 0\n"
        "heavy = sorted(m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr

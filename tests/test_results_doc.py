"""docs/results.md is exactly what `minimodel report` makes of the study's committed results (docs/results/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

RESULTS = ROOT / "docs" / "results"


@pytest.mark.skipif(not (RESULTS / "study").is_dir(), reason="no committed study results")
def test_the_committed_study_results_regenerate_docs_results_md(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(RESULTS, runs)
    out = tmp_path / "results.md"
    env = {**os.environ, "WANDB_MODE": "disabled"}
    p = subprocess.run([sys.executable, "-m", "minimodel.cli", "report", "experiments/study_beyond.yaml", f"runs_dir={runs}",
                        "--out", str(out), "--no-progress"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert out.read_text() == (ROOT / "docs" / "results.md").read_text()
    assert (tmp_path / "plots" / "lohelp.png").stat().st_size > 10_000
    assert "## The paper's claims" in out.read_text()

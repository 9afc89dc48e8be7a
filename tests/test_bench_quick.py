"""The benchmarks `make bench` and `make gpu-check` run (benchmarks/run_all.py) at their quick size on the CPU: each
runs to its end and its figures reach the summary. Nothing is timed here (the figures are the benchmarks' business);
this is what keeps an interface change from breaking a benchmark unseen, as one did to bench_data.py's call of
``encode_corpus`` until the GPU check's CPU rehearsal ran it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow


def test_every_benchmark_of_run_all_runs_at_its_quick_size(tmp_path):
    out = tmp_path / "quick.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--device", "cpu", "--quick", "--out",
                        str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    figures = json.loads(out.read_text())
    assert figures["summary"], figures.keys()
    names = " ".join(row[0] for row in figures["summary"])
    for needed in ("adapt speedup", "matmul peak", "loader", "peak memory"):
        assert needed in names, (needed, names)

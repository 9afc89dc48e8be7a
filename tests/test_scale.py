"""Step 4 that scales out: one evaluation per language, several processes over disjoint checkpoints appending to
one results file without duplicates, and SIGUSR1/SIGTERM handled like training (finish the row, exit 3, resume)."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from minimodel.cli import main
from minimodel.store.results import ResultsTable, row_id

pytestmark = pytest.mark.slow


def fresh(tiny_finetuned, tmp_path: Path) -> tuple[list[str], Path, list[dict]]:
    """The tiny experiment's trained runs copied to ``tmp_path`` without its results; the reference rows."""
    tmp, cfg, args = tiny_finetuned
    reference = ResultsTable(Path(cfg.runs_dir) / cfg.name / "bl_base" / "results.jsonl").rows()
    runs_dir = tmp_path / "runs"
    shutil.copytree(Path(cfg.runs_dir), runs_dir, ignore=shutil.ignore_patterns("results.jsonl", "wandb"))
    return [*args, f"runs_dir={runs_dir}"], runs_dir / cfg.name / "bl_base" / "results.jsonl", reference


def same_rows(got: list[dict], want: list[dict]) -> None:
    assert len({row_id(r) for r in got}) == len(got), "duplicate rows"
    assert {row_id(r): r["value"] for r in got} == pytest.approx({row_id(r): r["value"] for r in want})


def test_one_evaluation_per_language(tiny_finetuned, tmp_path):
    args, results, reference = fresh(tiny_finetuned, tmp_path)
    assert main(["evaluate", *args, "lang=tr"]) == 0
    rows = ResultsTable(results).rows()
    assert {r["lang"] for r in rows} == {"tr", "en"}  # Turkish and the English scores of the finetuned models
    assert main(["evaluate", *args, "lang=de"]) == 0
    assert main(["evaluate", *args]) == 0  # nothing left: no row twice
    same_rows(ResultsTable(results).rows(), reference)


def test_processes_share_out_the_checkpoints(tiny_finetuned, tmp_path, monkeypatch):
    """Two processes of one job (srun --ntasks=2): each evaluates its own (task, seed, language) units; their
    rows, appended to one file, are the rows of one process."""
    args, results, reference = fresh(tiny_finetuned, tmp_path)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    seen = []
    for rank in ("1", "0"):
        monkeypatch.setenv("SLURM_PROCID", rank)
        monkeypatch.setenv("SLURM_LOCALID", rank)
        assert main(["evaluate", *args]) == 0
        seen.append({(r["seed"], r["lang"]) for r in ResultsTable(results).rows() if r["step"] >= 0})
    assert seen[0] and seen[0] < seen[1]  # rank 1 did part; rank 0 the rest
    same_rows(ResultsTable(results).rows(), reference)


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_signal_stops_after_the_current_row_and_the_rerun_resumes(tiny_finetuned, tmp_path, monkeypatch, sig):
    import minimodel.stages.evaluate as stage

    args, results, reference = fresh(tiny_finetuned, tmp_path)
    real, calls = stage.predict, []

    def evaluate_then_signal(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), sig)  # SLURM's warning arrives in the middle of the second evaluation
        return real(*a, **k)

    monkeypatch.setattr(stage, "predict", evaluate_then_signal)
    assert main(["evaluate", *args]) == 3  # requeue
    partial = [r for r in ResultsTable(results).rows() if r["step"] >= 0]
    assert len(calls) == 2 and len(partial) == 2  # the row being evaluated was finished and written
    assert signal.getsignal(sig) is not evaluate_then_signal  # handlers restored
    assert main(["evaluate", *args]) == 0
    assert len(calls) == len([r for r in reference if r["step"] >= 0])  # the rerun did only what was left
    same_rows(ResultsTable(results).rows(), reference)

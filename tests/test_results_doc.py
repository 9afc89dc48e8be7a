"""docs/results.md, docs/decoder/results.md, docs/real/results.md, docs/real/fr/results.md and docs/real/sib200's four
reports are exactly what `minimodel report` makes of the committed study results (docs/results/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

RESULTS = ROOT / "docs" / "results"
RECIPE_PAIR = "report.systems={bl_base@mean: bl_base, minipost-recipe@mean: minipost}"
LATIN_PAIR = "report.systems={bl_base@extend-mean: bl_base, minipost-recipe@extend-mean: minipost}"  # the Makefile's
DOCS = [("study", "study_beyond.yaml", "results.md", "lohelp", ()),
        ("study_decoder", "study_decoder.yaml", "decoder/results.md", "lohelp", ()),
        ("study_real", "study_real.yaml", "real/results.md", "wiki_topics", ()),
        ("study_real_fr", "study_real_fr.yaml", "real/fr/results.md", "wiki_topics", ()),
        ("study_sib200", "study_sib200.yaml", "real/sib200/results.md", "sib200", ()),
        ("study_sib200", "study_sib200.yaml", "real/sib200/recipe/results.md", "sib200", (RECIPE_PAIR,)),
        ("study_sib200_latin", "study_sib200_latin.yaml", "real/sib200/latin/results.md", "sib200", ()),
        ("study_sib200_latin", "study_sib200_latin.yaml", "real/sib200/latin/recipe/results.md", "sib200",
         (LATIN_PAIR,))]


@pytest.mark.parametrize("study,experiment,doc,task,overrides", DOCS)
def test_the_committed_study_results_regenerate_their_document(tmp_path, study, experiment, doc, task, overrides):
    if not (RESULTS / study).is_dir():
        pytest.skip(f"no committed {study} results")
    runs = tmp_path / "runs"
    shutil.copytree(RESULTS, runs)
    out = tmp_path / doc  # its plots go next to it, as docs/plots/ and docs/decoder/plots/
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "WANDB_MODE": "disabled"}
    p = subprocess.run([sys.executable, "-m", "minimodel.cli", "report", f"experiments/{experiment}",
                        f"runs_dir={runs}", *overrides, "--out", str(out), "--no-progress"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert out.read_text() == (ROOT / "docs" / doc).read_text()
    assert (out.parent / "plots" / f"{task}.png").stat().st_size > 10_000
    assert "## The paper's claims" in out.read_text()

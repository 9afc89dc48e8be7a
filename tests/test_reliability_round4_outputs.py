"""Issue 54, parts 3, 4, 5 and 7: outputs that never overwrite what they did not write, cluster and CPU values
checked at load, advice that works when followed, and the smaller items (docs/bad-input.md, "Round 4")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from minimodel.cli import main
from tests.conftest import ROOT

DEMO = ROOT / "experiments" / "demo.yaml"


def demo_runs(tmp_path: Path) -> Path:
    """The demo's recorded results (tests/golden/demo) as a runs directory."""
    runs = tmp_path / "runs"
    for recorded in sorted((ROOT / "tests" / "golden" / "demo").glob("*.results.jsonl")):
        system = recorded.name.split(".")[0]
        (runs / "demo" / system).mkdir(parents=True)
        shutil.copy(recorded, runs / "demo" / system / "results.jsonl")
    return runs


def report(runs: Path, *extra: str) -> int:
    return main(["report", str(DEMO), f"runs_dir={runs}", f"tasks.lohelp.source={ROOT / 'data/demo/task/lohelp'}",
                 "logging.wandb=disabled", "--no-progress", *extra])


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error:" in line]


# ------------------------------------------------------------------------------------------ part 3: outputs


@pytest.mark.parametrize("victim", ["results.jsonl", "last.ckpt", "notes.md"])
def test_report_out_refuses_a_file_it_did_not_write(tmp_path, capsys, victim):
    runs = demo_runs(tmp_path)
    target = runs / "demo" / "bl_base" / victim if victim == "results.jsonl" else tmp_path / victim
    if victim != "results.jsonl":
        target.write_bytes(b"PK\x03\x04 a finished pretraining's checkpoint" if victim == "last.ckpt" else b"mine\n")
    before = target.read_bytes()
    assert report(runs, "--out", str(target)) == 2
    err = capsys.readouterr().err
    assert len(error_lines(err)) == 1 and str(target) in err and "--force" in err and "Traceback" not in err
    assert target.read_bytes() == before


def test_report_out_refuses_a_directory_without_a_traceback(tmp_path, capsys):
    runs = demo_runs(tmp_path)
    folder = tmp_path / "somewhere"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    assert report(runs, "--out", str(folder)) == 2
    err = capsys.readouterr().err
    assert f"--out {folder} is a directory" in err and "Traceback" not in err
    assert (folder / "keep.txt").read_text() == "mine" and sorted(p.name for p in folder.iterdir()) == ["keep.txt"]


def test_report_out_replaces_its_own_report_and_force_replaces_anything(tmp_path, capsys):
    runs = demo_runs(tmp_path)
    out = tmp_path / "docs" / "results.md"
    out.parent.mkdir()
    assert report(runs, "--out", str(out)) == 0  # new
    first = out.read_text()
    assert first.startswith("# Mini-model adaptation: demo")
    out.write_text(first + "an old line\n")
    assert report(runs, "--out", str(out)) == 0  # a report it wrote: replaced (make's docs targets do this)
    assert out.read_text() == first
    mine = tmp_path / "mine.md"
    mine.write_text("my notes\n")
    assert report(runs, "--out", str(mine)) == 2
    assert report(runs, "--out", str(mine), "--force") == 0
    assert mine.read_text() == first


def test_a_new_report_does_not_write_its_plots_over_files_already_there(tmp_path, capsys):
    runs = demo_runs(tmp_path)
    out = tmp_path / "paper" / "r.md"
    (out.parent / "plots").mkdir(parents=True)
    mine = out.parent / "plots" / "lohelp.png"
    mine.write_bytes(b"my own figure")
    assert report(runs, "--out", str(out)) == 2
    err = capsys.readouterr().err
    assert str(mine) in err and "--force" in err and not out.exists()
    assert mine.read_bytes() == b"my own figure"
    assert report(runs, "--out", str(out), "--force") == 0
    assert mine.read_bytes() != b"my own figure" and out.is_file()
    assert report(runs, "--out", str(out)) == 0  # now an earlier report's plots: replaced


def test_export_out_refuses_what_it_did_not_write(tmp_path):
    from minimodel.errors import ConfigError
    from minimodel.export import _check_out

    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        _check_out(f, force=True)
    d = tmp_path / "d"
    d.mkdir()
    (d / "keep").write_text("x")
    with pytest.raises(ConfigError, match="not empty"):
        _check_out(d, force=False)
    with pytest.raises(ConfigError, match="not a minimodel export"):
        _check_out(d, force=True)

"""Issue 54, round 5: export's bad arguments as the project's errors (exit 2, one line naming the argument or key,
nothing written), and the advice of docs/bad-input.md followed literally (docs/bad-input.md, "Round 5")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minimodel.cli import main
from tests.conftest import ROOT

TINY_YAML = str(ROOT / "experiments" / "tiny.yaml")


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "error:" in line]


def one_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line a refused command printed (and no traceback)."""
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def tree(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------ part 3: export's arguments


def export(tmp_path: Path, *extra: str) -> int:
    """``minimodel export`` of the tiny experiment, whose runs (none) would be under ``tmp_path/runs``."""
    return main(["export", TINY_YAML, f"runs_dir={tmp_path / 'runs'}", "system=bl_base", "model.mini_heads=[]",
                 "logging.wandb=disabled", "--no-progress", *extra])


@pytest.mark.parametrize("extra,message", [
    # a model no transformers class holds: refused before anything is read (was a ValueError traceback after the
    # model was loaded; an affine map was dropped without a word)
    (["model.affine_after=1"], "model.affine_after=1: the model maps its state by an affine map after layer 1"),
    (["model.family=decoder", "model.norm=layernorm", "model.positions=rotary", "model.max_positions=512"],
     "a decoder with model.norm=layernorm, model.positions=rotary, model.activation=gelu"),
    # a task without its seed (was: "…/seed0/model.pt not found: run `minimodel finetune ... seed=0`")
    (["task=xnli"], "export task=xnli needs seed=N, the finetuning run to export (finetune.seeds: ["),
    (["--embeddings-only", "--embeddings", "{tmp}/emb"], "--embeddings-only with --embeddings"),
    (["--embeddings", "{tmp}/nowhere"], "--embeddings {tmp}/nowhere: no such directory"),
    (["--embeddings", "{tmp}/afile"], "--embeddings {tmp}/afile: a file, not a directory"),
    # a full export given as --embeddings: the advice names a new directory, not the export itself (which --out
    # would then refuse: a dead end)
    (["--embeddings", "{tmp}/full"], "--embeddings {tmp}/full is a fill-mask export, not an embeddings export: it "
                                     "lacks embeddings.pt; write one with `minimodel export ... --embeddings-only "
                                     "--out DIR` (DIR: a new directory) and pass --embeddings DIR"),
])
def test_export_refuses_what_it_cannot_export_before_reading_anything(tmp_path, capsys, extra, message):
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "minimodel.json").write_text(json.dumps({"kind": "fill-mask"}))
    before = tree(tmp_path)
    args = [x.replace("{tmp}", str(tmp_path)) for x in extra]
    assert export(tmp_path, "lang=de", "--out", str(tmp_path / "out"), *args) == 2
    assert message.replace("{tmp}", str(tmp_path)) in one_error(capsys)
    assert tree(tmp_path) == before and not (tmp_path / "out").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("out,force,message", [
    ("afile/sub/out", False, "--out {tmp}/afile/sub/out: {tmp}/afile is a file, so no directory can be made under it"),
    ("afile", False, "--out {tmp}/afile is a file, not a directory: choose another --out"),
    ("mine", False, "--out {tmp}/mine exists and is not empty: choose another directory (or --force"),
    ("mine", True, "--out {tmp}/mine holds files that are not a minimodel export (it has no minimodel.json): not "
                   "replacing them, even with --force; choose a new or empty directory as --out"),
])
def test_export_out_names_what_is_there_and_overwrites_nothing(tmp_path, capsys, out, force, message):
    """``--out`` under a file was a FileExistsError traceback; a directory of the user's is refused with advice."""
    (tmp_path / "afile").write_text("mine\n")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep\n")
    before = tree(tmp_path)
    assert export(tmp_path, "lang=de", "--out", str(tmp_path / out), *(["--force"] if force else [])) == 2
    assert message.replace("{tmp}", str(tmp_path)) in one_error(capsys)
    assert tree(tmp_path) == before


def test_an_unexportable_decoder_config_is_a_config_error():
    """``hf_decoder.hf_config`` / ``export_type`` refuse with the project's error (``ConfigError``, still a
    ``ValueError``) naming the ``model.*`` keys, wherever they are called from."""
    from dataclasses import replace

    from minimodel.config.schema import ModelConfig
    from minimodel.errors import ConfigError
    from minimodel.models import hf_decoder

    cfg = replace(ModelConfig(), family="decoder", norm="rmsnorm", positions="learned", activation="swiglu",
                  bias=False)
    with pytest.raises(ConfigError, match=r"model\.norm=rmsnorm, model\.positions=learned, model\.activation=swiglu"):
        hf_decoder.hf_config(cfg, 0, 2, 1)

"""Typed, versioned checkpoint payloads: round trips, clear refusals, and files written by older code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from minimodel.data.tokenizer import Tokenizer
from minimodel.models.surgery import plug_embeddings
from minimodel.store.checkpoints import (
    FORMAT,
    Adaptation,
    CheckpointError,
    Finetuned,
    TrainingMeta,
    atomic_torch_save,
    load_adaptation,
    load_checkpoint,
    load_finetuned,
    load_trained_model,
)
from tests.conftest import ROOT

LEGACY = ROOT / "tests" / "fixtures" / "legacy"


def adaptation(**kw) -> Adaptation:
    base = dict(system="bl_base", lang="de", embeddings=torch.randn(8, 4), bias=torch.zeros(8),
                tokenizer={"path": "de/spm.model", "sha256": "a" * 64, "vocab_size": 8}, step=3, flops=1.5)
    return Adaptation(**{**base, **kw})


def test_adaptation_round_trip_writes_kind_and_format(tmp_path: Path) -> None:
    a = adaptation()
    atomic_torch_save(a.to_dict(), tmp_path / "a.pt")
    raw = load_checkpoint(tmp_path / "a.pt")
    assert raw["kind"] == "adaptation" and raw["format"] == FORMAT == 3
    b = load_adaptation(tmp_path / "a.pt")
    assert torch.equal(a.embeddings, b.embeddings) and (b.system, b.lang, b.step, b.flops) == ("bl_base", "de", 3, 1.5)


@pytest.mark.parametrize("change, message", [
    ({"format": FORMAT + 1}, r"was written by a newer minimodel \(format 4; this one reads up to 3\): upgrade"),
    ({"format": "two"}, r"unknown checkpoint format 'two'"),
    ({"format": 0}, r"unknown checkpoint format 0"),
    ({"kind": "finetuned"}, r"holds a 'finetuned' payload: it is not an adaptation checkpoint"),
])
def test_unknown_or_newer_formats_are_refused_naming_the_file(tmp_path: Path, change: dict, message: str) -> None:
    path = tmp_path / "odd.pt"
    atomic_torch_save({**adaptation().to_dict(), **change}, path)
    with pytest.raises(CheckpointError, match=f"{path}.*" if "newer" in message else str(path)) as e:
        load_adaptation(path)
    assert e.match(message)


def test_a_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.pt"
    atomic_torch_save({"format": 1, "weights": torch.zeros(2)}, path)  # an old-style dict that is no adaptation
    with pytest.raises(CheckpointError, match=r"x.pt is not an adaptation checkpoint \(missing \['bias', 'embeddings'"):
        load_adaptation(path)
    with pytest.raises(CheckpointError, match=r"x.pt is not a minimodel training checkpoint"):
        load_trained_model(path)


def test_legacy_adaptation_checkpoint_is_migrated_and_plugs_into_the_legacy_finetuned_model() -> None:
    raw = load_checkpoint(LEGACY / "adapt_step0000002.pt")
    assert raw["format"] == 1 and "kind" not in raw  # really written before this change
    a = load_adaptation(LEGACY / "adapt_step0000002.pt")
    assert (a.system, a.lang, a.step, a.stage) == ("bl_base", "de", 2, "adapt")
    assert a.flops > 0 and a.v100_days > 0 and a.body.endswith("last.ckpt") and a.body_layers == 2
    assert torch.equal(a.embeddings, raw["embeddings"])
    body, head, ft = load_finetuned(LEGACY / "finetuned_model.pt")
    assert "format" not in load_checkpoint(LEGACY / "finetuned_model.pt")
    assert (ft.task, ft.seed, ft.body, ft.qa) == ("lohelp", 1, "primary", False) and len(ft.labels) == 4
    assert set(ft.english) == {"dev", "test"}
    tok = Tokenizer(LEGACY / "de_spm.model")
    plug_embeddings(body, a, tok.sha256, tok.vocab_size)
    assert body.heads["primary"].decoder.weight is body.embeddings.tokens.weight
    ids = torch.tensor([[0, *tok.encode_one("Wählen Sie eine Zelle aus.")[:20], 2]])
    assert head.eval()(body.eval().encode(ids)).shape == (1, 4)


def test_legacy_training_checkpoint_keeps_its_stage_specific_fields() -> None:
    model, meta = load_trained_model(LEGACY / "pretrain_last.ckpt")
    assert "format" not in load_checkpoint(LEGACY / "pretrain_last.ckpt")["minimodel"]
    assert (meta.stage, meta.system, meta.lang, meta.step) == ("pretrain", "bl_base", "en", 4)
    assert meta.tokenizer["sha256"] and meta.flops > 0 and model.cfg.layers == 2


def test_training_meta_and_finetuned_round_trip(tmp_path: Path) -> None:
    meta = TrainingMeta(stage="bridge", system="minipost", model_config={"layers": 2}, extra={"depth": 1})
    ckpt = {"minimodel": meta.to_dict()}
    assert TrainingMeta.from_checkpoint(ckpt, "x.ckpt") == meta
    ft = Finetuned(system="bl_base", task="t", seed=1, model_config={}, labels=["a"], qa=False,
                   body_state={}, head_state={})
    atomic_torch_save(ft.to_dict(), tmp_path / "model.pt")
    assert Finetuned.from_dict(load_checkpoint(tmp_path / "model.pt"), "model.pt") == ft
    with pytest.raises(CheckpointError, match="holds a 'finetuned' payload: it is not an adaptation checkpoint"):
        load_adaptation(tmp_path / "model.pt")

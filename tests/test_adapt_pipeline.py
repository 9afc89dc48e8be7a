"""Tiny end-to-end runs of steps 1, 1b and 2 for all four systems on real English, German and Turkish."""

import json
from pathlib import Path

import pytest
import torch

from minimodel.data.tokenizer import Tokenizer
from minimodel.flops import adapt_flops, bridge_flops
from minimodel.models.model import PRIMARY
from minimodel.models.surgery import PlugError, plug_embeddings, primary_only
from minimodel.stages.adapt import run_adapt
from minimodel.stages.bridge import run_bridge
from minimodel.stages.pretrain import run_pretrain
from minimodel.store.checkpoints import FORMAT, load_adaptation, load_checkpoint, load_trained_model
from minimodel.store.layout import adaptation_checkpoints
from tests.conftest import TINY_STAGE, stage_overrides, tiny_config

pytestmark = pytest.mark.slow

STAGES = stage_overrides(["pretrain", "bridge", "adapt"], updates=12, **TINY_STAGE, ckpt_every=6, val_every=6,
                         log_every=2)


def cfg(tmp: Path, prepared: Path, corpus: Path, system: str, *extra: str):
    heads = "model.mini_heads=[2]" if system == "minijoint" else "model.mini_heads=[]"
    return tiny_config(tmp, corpus, f"system={system}", heads, "bridge.depth=2", "bridge.layers=1",
                       "adapt.trainer.ckpt_steps=[2,4]", *STAGES, *extra, prepared=prepared)


def body_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    state = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")["state_dict"]
    return {k: v for k, v in state.items() if "tokens" not in k and "decoder" not in k and not k.endswith("heads.primary.bias")}


def test_all_systems_pretrain_bridge_adapt_and_plug(tmp_path, prepared, corpus_dir):
    # step 1: BL_BASE (also MiniPost's primary model) and MiniJoint
    base_dir = run_pretrain(cfg(tmp_path, prepared, corpus_dir, "bl_base"), progress_bar=False).run_dir
    joint_dir = run_pretrain(cfg(tmp_path, prepared, corpus_dir, "minijoint"), progress_bar=False).run_dir

    # step 1b: MiniPost from BL_BASE; only the bridge layer changes
    bridge_cfg = cfg(tmp_path, prepared, corpus_dir, "minipost")
    bridge_dir = run_bridge(bridge_cfg, progress_bar=False).run_dir
    mini, meta = load_trained_model(bridge_dir / "checkpoints" / "last.ckpt")
    primary, _ = load_trained_model(base_dir / "checkpoints" / "last.ckpt")
    assert mini.cfg.layers == 3 and meta.flops == pytest.approx(
        12 * bridge_flops(3, 64, 64, 1000, 0.15, 8, 1, trainable_layers=1))
    for name, value in mini.state_dict().items():
        if not name.startswith("layers.2."):
            ref = primary.state_dict()[name]
            assert torch.equal(value, ref), f"{name} changed during the bridge"
    assert not torch.equal(mini.layers[2].qkv.weight, mini.layers[1].qkv.weight)

    # step 2 for each system; frozen parts stay bit-identical, the adaptation checkpoints are small
    expected_layers = {"bl_base": 4, "minijoint": 2, "minipost": 3}
    for system, lang in [("bl_base", "de"), ("minijoint", "tr"), ("minipost", "de")]:
        c = cfg(tmp_path, prepared, corpus_dir, system, f"lang={lang}")
        run_dir = run_adapt(c, progress_bar=False).run_dir
        info = json.loads((run_dir / "adapt_info.json").read_text())
        assert info["trainable_parameters"] == 1000 * 64 + 1000
        assert info["body_layers"] == expected_layers[system]
        assert 0 < info["overlapping_pieces"] < 1000
        ckpts = adaptation_checkpoints(run_dir)
        assert [p.name for p in ckpts] == [f"step{s:07d}.pt" for s in (0, 2, 4, 6, 12)]
        first, last = load_adaptation(ckpts[0]), load_adaptation(ckpts[-1])
        assert last.step == 12 and last.lang == lang and last.system == system
        assert last.flops == pytest.approx(12 * adapt_flops(expected_layers[system], 64, 64, 1000, 0.15, 8, 1))
        raw = load_checkpoint(ckpts[-1])
        assert raw["kind"] == "adaptation" and raw["format"] == FORMAT
        assert set(raw) >= {"embeddings", "bias", "tokenizer", "step", "flops", "v100_days"}
        assert "state_dict" not in raw and ckpts[-1].stat().st_size < 400_000
        assert not torch.equal(first.embeddings, last.embeddings)
        # the body the embeddings were trained over is untouched
        if system == "bl_base":
            source = body_weights(base_dir)
        elif system == "minijoint":
            source = {k.replace("heads.l2.", "heads.primary."): v for k, v in body_weights(joint_dir).items()
                      if not k.startswith(("model.layers.2.", "model.layers.3.", "model.heads.primary."))
                      and k != "model.heads.l2.bias"}
        else:
            source = body_weights(bridge_dir)
        adapted = body_weights(run_dir)
        assert adapted.keys() == source.keys()
        for k in adapted:
            assert torch.equal(adapted[k], source[k]), f"{system}: frozen {k} changed"

        # plug into the primary model with the matching tokenizer; a mismatched one fails clearly
        target_tok = Tokenizer(prepared / "prepared" / lang / "spm.model")
        primary_src = base_dir if system != "minijoint" else joint_dir
        model = primary_only(load_trained_model(primary_src / "checkpoints" / "last.ckpt")[0])
        plug_embeddings(model, last, target_tok.sha256, target_tok.vocab_size)
        assert model.cfg.layers == 4 and model.heads[PRIMARY].decoder.weight is model.embeddings.tokens.weight
        assert torch.equal(model.embeddings.tokens.weight, last.embeddings)
        ids = torch.tensor([[0] + target_tok.encode_one("Das ist ein kleiner Test.")[:20] + [2]])
        assert torch.isfinite(model.eval().mlm_logits(ids)).all()
        other = Tokenizer(prepared / "prepared" / ("tr" if lang == "de" else "de") / "spm.model")
        with pytest.raises(PlugError, match="was trained with tokenizer"):
            plug_embeddings(model, last, other.sha256, other.vocab_size)

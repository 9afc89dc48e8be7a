"""minimodel.models.hf: tiny random HF RoBERTa / XLM-R checkpoints <-> RobertaMLM give the same logits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from minimodel.errors import CheckpointError, ConfigError  # noqa: E402
from minimodel.models.hf import from_hf, hf_config_to_model_config, to_hf  # noqa: E402
from minimodel.models.model import ModelConfig, RobertaMLM  # noqa: E402

PAD = 1
TINY = dict(
    vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
    max_position_embeddings=66, pad_token_id=PAD, bos_token_id=0, eos_token_id=2,
)


def perturb_(module: torch.nn.Module, seed: int = 0) -> None:
    """Add noise to every parameter (biases, LayerNorms, token types included) so no mis-mapping can hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():  # tied parameters are visited once
            p.add_(0.1 * torch.randn(p.shape, generator=g))


def make_batch(vocab: int, seed: int = 1) -> torch.Tensor:
    """(3, 20) ids without pad, then padded rows: one ending in 5 pads, one with a single pad."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 20), generator=g)
    ids[:, 0] = 0
    ids[1, 15:] = PAD
    ids[2, 19:] = PAD
    return ids


def save_tiny_hf(kind: str, path: Path, **overrides: object) -> torch.nn.Module:
    config_cls, model_cls = {
        "roberta": (transformers.RobertaConfig, transformers.RobertaForMaskedLM),
        "xlm-roberta": (transformers.XLMRobertaConfig, transformers.XLMRobertaForMaskedLM),
    }[kind]
    torch.manual_seed(0)
    hf = model_cls(config_cls(**{**TINY, **overrides}))
    perturb_(hf)
    assert hf.roberta.embeddings.token_type_embeddings.weight.abs().min() > 0
    hf.save_pretrained(str(path))
    return hf.eval()


def hf_logits(hf: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=ids.ne(PAD).long()).logits


def our_logits(model: RobertaMLM, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval().mlm_logits(ids)


def assert_same_logits(ours: torch.Tensor, theirs: torch.Tensor, ids: torch.Tensor) -> None:
    assert ours.shape == theirs.shape == (*ids.shape, theirs.shape[-1])
    keep = ids.ne(PAD)
    torch.testing.assert_close(ours[keep], theirs[keep], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("kind", "type_vocab_size"), [("roberta", 1), ("xlm-roberta", 1), ("roberta", 2)])
def test_from_hf_matches_hf_logits(tmp_path: Path, kind: str, type_vocab_size: int) -> None:
    hf = save_tiny_hf(kind, tmp_path, type_vocab_size=type_vocab_size)
    model = from_hf(tmp_path)
    assert model.cfg == ModelConfig(vocab_size=300, hidden=64, layers=2, heads=4, ffn=128, max_positions=66,
                                    dropout=0.1, attn_dropout=0.1, layer_norm_eps=1e-12, pad_id=PAD)
    ids = make_batch(300)
    assert_same_logits(our_logits(model, ids), hf_logits(hf, ids), ids)


def test_from_hf_keeps_the_tie(tmp_path: Path) -> None:
    save_tiny_hf("roberta", tmp_path)
    model = from_hf(tmp_path)
    assert model.heads["primary"].decoder.weight is model.embeddings.tokens.weight
    assert model.num_parameters() == sum(p.numel() for p in set(model.parameters()))


@pytest.mark.parametrize("xlmr", [False, True])
def test_to_hf_round_trip(tmp_path: Path, xlmr: bool) -> None:
    torch.manual_seed(0)
    model = RobertaMLM(ModelConfig(vocab_size=300, hidden=64, layers=2, heads=4, ffn=128, max_positions=66,
                                   mini_heads=[1]))
    perturb_(model)
    to_hf(model, tmp_path / "hf", xlmr=xlmr)

    config = transformers.AutoConfig.from_pretrained(str(tmp_path / "hf"))
    assert config.model_type == ("xlm-roberta" if xlmr else "roberta")
    assert (config.type_vocab_size, config.pad_token_id, config.bos_token_id, config.eos_token_id) == (1, PAD, 0, 2)
    assert config.tie_word_embeddings
    cls = transformers.XLMRobertaForMaskedLM if xlmr else transformers.RobertaForMaskedLM
    hf = cls.from_pretrained(str(tmp_path / "hf")).eval()
    assert not hf.roberta.embeddings.token_type_embeddings.weight.any()
    ids = make_batch(300)
    assert_same_logits(our_logits(model, ids), hf_logits(hf, ids), ids)

    back = from_hf(tmp_path / "hf")
    assert back.cfg.head_names == ["primary"]  # mini heads are not exported
    assert back.cfg == ModelConfig(**{**model.cfg.to_dict(), "mini_heads": []})
    expected = {k: v for k, v in model.state_dict().items() if not k.startswith("heads.l1.")}
    got = back.state_dict()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key
    assert back.heads["primary"].decoder.weight is back.embeddings.tokens.weight


@pytest.mark.parametrize(("field", "value"), [("hidden_act", "relu"), ("is_decoder", True)])
def test_unsupported_config_is_a_clear_error(tmp_path: Path, field: str, value: object) -> None:
    save_tiny_hf("roberta", tmp_path, **{field: value})
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path / 'config.json'}: unsupported {field}={value!r}")):
        from_hf(tmp_path)


def test_unsupported_model_type(tmp_path: Path) -> None:
    config = transformers.BertConfig(**TINY)
    with pytest.raises(ConfigError, match=r"unsupported model_type='bert'"):
        hf_config_to_model_config(config, source="bert-dir")


def test_untied_decoder_is_rejected(tmp_path: Path) -> None:
    hf = save_tiny_hf("roberta", tmp_path, tie_word_embeddings=False)
    assert not torch.equal(hf.lm_head.decoder.weight, hf.roberta.embeddings.word_embeddings.weight)
    with pytest.raises(CheckpointError, match="differs from the word embeddings"):
        from_hf(tmp_path)

"""The decoder family (``model.family: decoder``, minimodel/models/decoder.py): causal attention, LM heads at chosen depths,
tied and untied output projections, right padding, last-token pooling, the surgery of the four systems, the
configuration checks and the FLOP counts of a causal LM (every position predicts)."""

from __future__ import annotations

import pytest
import torch

from minimodel.config.schema import PRIMARY, ModelConfig
from minimodel.errors import ConfigError
from minimodel.flops import adapt_flops, bridge_flops, layer_flops, pretrain_flops
from minimodel.models.families import REGISTRY, Objective, build, predicted_share
from minimodel.models.model import ClassificationHead
from minimodel.models.surgery import (
    adaptation_state,
    adaptation_trainable,
    build_minipost,
    extract_mini,
    freeze_all_but,
    swap_embeddings,
)
from tests.conftest import ROOT, tiny_config

GPT2 = dict(norm="layernorm", positions="learned", activation="gelu_tanh", bias=True, tie_embeddings=True)
LLAMA = dict(norm="rmsnorm", positions="rotary", activation="swiglu", bias=False, tie_embeddings=False)
STYLES = {"gpt2": GPT2, "llama": LLAMA}


def decoder(style: str = "gpt2", **extra: object):
    torch.manual_seed(0)
    cfg = ModelConfig(family="decoder", vocab_size=97, hidden=32, layers=4, heads=4, ffn=64, max_positions=24,
                      dropout=0.0, attn_dropout=0.0, mini_heads=[2], **{**STYLES[style], **extra})  # type: ignore[arg-type]
    return build(cfg).eval()


def ids(batch: int = 2, length: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(5, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("style", list(STYLES))
def test_a_future_token_does_not_change_earlier_logits(style):
    model, x = decoder(style), ids()
    y = x.clone()
    y[:, 7] = (y[:, 7] + 1) % 97
    with torch.no_grad():
        a, b = model.logits(x), model.logits(y)
        mini_a, mini_b = model.logits(x, "l2"), model.logits(y, "l2")
    assert torch.equal(a[:, :7], b[:, :7]) and torch.equal(mini_a[:, :7], mini_b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])  # and it does change its own and later positions


@pytest.mark.parametrize("style", list(STYLES))
def test_a_head_after_layer_n_computes_only_layers_1_to_n(style):
    model, x = decoder(style), ids()
    labels = torch.cat([x[:, 1:], torch.full((2, 1), -100)], dim=1)
    ran: list[int] = []
    for i, layer in enumerate(model.layers):
        layer.register_forward_hook(lambda *a, i=i: ran.append(i))
    with torch.no_grad():
        losses = model.lm_losses(x, labels, ["l2"])
    assert ran == [0, 1] and set(losses) == {"l2"}
    ran.clear()
    with torch.no_grad():
        both = model.lm_losses(x, labels)
    assert ran == [0, 1, 2, 3] and set(both) == {PRIMARY, "l2"}
    assert torch.equal(both["l2"], losses["l2"])  # the same layers, computed once for both heads
    # the loss is the next-token cross-entropy at every position but the last
    logits = model.logits(x, "l2")[:, :-1]
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 97), x[:, 1:].reshape(-1))
    assert torch.allclose(losses["l2"], expected, atol=1e-6)


def test_tied_and_untied_output_projections():
    tied, untied = decoder("gpt2"), decoder("llama")
    for head in tied.heads.values():
        assert head.decoder.weight is tied.embeddings.tokens.weight
    shared = untied.heads[PRIMARY].decoder.weight
    assert shared is not untied.embeddings.tokens.weight and untied.heads["l2"].decoder.weight is shared
    assert not any(hasattr(h, "bias") and h.bias is not None for h in tied.heads.values())  # no output bias
    # step 2 trains the embeddings and (untied) the output projection, nothing else
    for model, expected in ((tied, {"embeddings.tokens.weight"}),
                            (untied, {"embeddings.tokens.weight", f"heads.{PRIMARY}.decoder.weight"})):
        freeze_all_but(model, adaptation_trainable)
        assert {n for n, p in model.named_parameters() if p.requires_grad} == expected


@pytest.mark.parametrize("style", list(STYLES))
def test_right_padding_leaves_the_real_tokens_alone_and_pooling_reads_the_last_one(style):
    model, x = decoder(style), ids(batch=1, length=9)
    padded = torch.cat([x, torch.full((1, 5), model.cfg.pad_id)], dim=1)
    with torch.no_grad():
        assert torch.allclose(model.encode(x), model.encode(padded, padded=True)[:, :9], atol=1e-6)
        head = ClassificationHead(32, 3, 0.0, pooling="last").eval()
        mask = torch.cat([torch.ones(1, 9), torch.zeros(1, 5)], dim=1).bool()
        assert torch.allclose(head(model.encode(x)), head(model.encode(padded), mask), atol=1e-6)
        first = ClassificationHead(32, 3, 0.0).eval()
        first.load_state_dict(head.state_dict())
        h = torch.randn(2, 6, 32)
        assert torch.equal(first(h), head(h[:, :1], None))  # "first" reads position 0


@pytest.mark.parametrize("style", list(STYLES))
def test_the_systems_surgery_on_a_decoder(style):
    model, x = decoder(style), ids()
    with torch.no_grad():
        mini = extract_mini(model, 2, "l2")  # MiniJoint's mini-model computes what the head at layer 2 computes
        assert torch.equal(mini.logits(x), model.logits(x, "l2"))
        post = build_minipost(model, 2, 1, seed=3)  # MiniPost: bottom 2 layers + 1 new trained layer
    assert post.cfg.layers == 3 and post.cfg.family == "decoder"
    assert {n.split(".")[1] for n, p in post.named_parameters() if p.requires_grad} == {"2"}
    for name, value in post.state_dict().items():
        if not name.startswith("layers.2."):
            assert torch.equal(value, model.state_dict()[name]), name
    # new target embeddings (and output projection when untied) of another vocabulary size
    weight = torch.randn(50, 32)
    output = None if model.cfg.tie_embeddings else torch.randn(50, 32)
    swap_embeddings(mini, weight, torch.zeros(50), output)
    state = adaptation_state(mini)
    assert state["embeddings"].shape == (50, 32) and state["bias"].numel() == 0
    assert (state["output"] is None) == model.cfg.tie_embeddings
    if output is not None:
        assert torch.equal(state["output"], output)
        assert mini.heads[PRIMARY].decoder.weight is not mini.embeddings.tokens.weight
    else:
        assert mini.heads[PRIMARY].decoder.weight is mini.embeddings.tokens.weight
    assert mini.logits(x[:, :4] % 50).shape == (2, 4, 50)


def test_decoder_options_are_checked_at_load_time(tmp_path):
    base = ["model.family=decoder", "model.max_positions=64"]
    cfg = tiny_config(tmp_path, tmp_path, *base)
    assert cfg.model.family == "decoder" and predicted_share(cfg) == 1.0
    assert REGISTRY["decoder"].objective is Objective.CAUSAL and REGISTRY["decoder"].pooling == "last"
    for bad, match in ((["model.family=gpt"], "model.family must be one of encoder, decoder"),
                       (["model.norm=rmsnorm"], "model.norm='rmsnorm' is not an option of model.family=encoder"),
                       (["model.tie_embeddings=false"], "ties its output projection"),
                       ([*base, "model.max_positions=63"], r"at least data.seq_len \(64\)"),
                       ([*base, "model.activation=relu"], "model.activation='relu'")):
        with pytest.raises(ConfigError, match=match):
            tiny_config(tmp_path, tmp_path, *bad)
    from minimodel.experiment import load_experiment

    study = load_experiment(ROOT / "experiments" / "study_decoder.yaml")
    assert study.model.family == "decoder" and study.finetune.seeds == [1, 2, 3]
    assert len(study.sweep) == 4 and "el" in study.target_langs


def test_causal_flops_equal_a_hand_count():
    """A1 / A3 / A4 with every position predicting (p = 1), counted by hand for l=6, h=64, s=64, V=2000, B=32."""
    l, h, s, V, B = 6, 64, 64, 2000, 32
    layer = 24 * s * h * h + 4 * h * s * s  # QKV + output + FFN (24 s h^2), scores and mix (4 h s^2)
    assert layer_flops(h, s) == layer == 6_291_456 + 1_048_576
    head = 2 * s * h * h + 2 * s * h * V  # the LM head at all s positions (the paper's head term: docs/flops.md)
    assert head == 524_288 + 16_384_000
    # A1 (MiniJoint: one more head): 3 x forward
    assert pretrain_flops(l, h, s, V, 1.0, B, 1, extra_heads=1) == 3 * B * (l * layer + 2 * head)
    # A3 over the 2-layer mini-model: forward + activation gradients + the output projection's weight gradient
    assert adapt_flops(2, h, s, V, 1.0, B, 1) == B * (2 * 2 * layer + 2 * head + 2 * s * h * V)
    # A4: 2 copied + 1 trained layer
    assert bridge_flops(3, h, s, V, 1.0, B, 1, trainable_layers=1) == B * ((3 + 2 - 1) * layer + 2 * head)
    # the closed form of A1 in docs/flops.md: 72 U B s l h^2 (1 + s/6h + 1/12l + V/12hl)
    closed = 72 * B * s * l * h * h * (1 + s / (6 * h) + 1 / (12 * l) + V / (12 * h * l))
    assert pretrain_flops(l, h, s, V, 1.0, B, 1) == pytest.approx(closed, rel=1e-12)
    # the encoder's p = 0.15 prices 15% of it: a causal LM's head costs 1/p = 6.7x more
    assert pretrain_flops(l, h, s, V, 1.0, B, 1) - pretrain_flops(l, h, s, V, 0.15, B, 1) == \
        pytest.approx(3 * B * 0.85 * head)


def test_the_reports_cost_table_prices_every_position_for_a_decoder():
    """`minimodel flops` and the report's costs (report/costs.py) use p = 1 for a causal LM, data.mask_prob otherwise."""
    from minimodel.config.load import load_config
    from minimodel.report.costs import cost_rows, cost_table

    for path, p in (("experiments/study_decoder.yaml", 1.0), ("experiments/study.yaml", 0.15)):
        cfg = load_config(ROOT / path)
        m, d, a = cfg.model, cfg.data, cfg.adapt.optim
        step2 = next(r for r in cost_rows(cfg) if r["step"] == "2 adapt (per language)")
        assert step2["flops"] == adapt_flops(m.layers, m.hidden, d.seq_len, m.vocab_size, p, a.global_batch, a.updates)
        assert f"p={p:g}," in cost_table(cfg)

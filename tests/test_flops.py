import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from minimodel.flops import V100_DAY, adapt_flops, bridge_flops, pretrain_flops, v100_days
from minimodel.models.model import IGNORE_INDEX, ModelConfig, RobertaMLM
from minimodel.models.surgery import adaptation_trainable, freeze_all_but

PAPER = dict(hidden=768, seq_len=512, vocab=50_000, mask_prob=0.15, batch=2048, updates=125_000)


def test_v100_day():
    assert V100_DAY == pytest.approx(2.592e18)


@pytest.mark.parametrize("layers,eflops,days", [(12, 54.1, 20.9), (4, 21.1, 8.1), (6, 29.3, 11.3)])
def test_adaptation_matches_the_paper(layers, eflops, days):
    f = adapt_flops(layers, **PAPER)
    assert round(f / 1e18, 1) == eflops and round(v100_days(f), 1) == days


def test_pretraining_and_bridge_match_the_paper():
    assert round(pretrain_flops(12, **PAPER) / 1e18, 1) == 78.8
    assert round(v100_days(pretrain_flops(12, **PAPER)), 1) == 30.4  # footnote 2
    assert round(v100_days(pretrain_flops(12, extra_heads=1, **PAPER)), 1) == 32.2  # MiniJoint, footnote 2
    assert round(bridge_flops(6, trainable_layers=2, **PAPER) / 1e18, 1) == 21.6
    # 4-layer adaptation is cheaper than 4-layer pretraining (29.3, appendix A.1)
    assert round(pretrain_flops(4, **PAPER) / 1e18, 1) == 29.3


def test_closed_forms_of_a1_and_a3():
    h, s, V, p, B, U, l = 768, 512, 50_000, 0.15, 2048, 125_000, 12
    a1 = 72 * U * B * s * l * h**2 * (1 + s / (6 * h) + p / (12 * l) + p * V / (12 * h * l))
    a3 = 48 * U * B * s * l * h**2 * (1 + s / (6 * h) + p / (12 * l) + p * V / (8 * h * l))
    assert pretrain_flops(l, **PAPER) == pytest.approx(a1, rel=1e-12)
    assert adapt_flops(l, **PAPER) == pytest.approx(a3, rel=1e-12)


def measured_adaptation_step_flops(layers: int, hidden: int, seq: int, vocab: int, batch: int, p: float) -> float:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=vocab, hidden=hidden, layers=layers, heads=hidden // 64, ffn=4 * hidden,
                      max_positions=seq + 2, dropout=0.0, attn_dropout=0.0)
    model = RobertaMLM(cfg)
    freeze_all_but(model, adaptation_trainable)
    x = torch.randint(5, vocab, (batch, seq))
    labels = torch.full_like(x, IGNORE_INDEX)
    n_mask = int(p * seq)
    labels[:, 1:1 + n_mask] = x[:, 1:1 + n_mask]  # exactly p*s masked positions per sequence
    # the math attention kernel runs as bmm's, which the counter sees (the fused CPU kernel it does not count)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model.mlm_losses(x, labels)["primary"].backward()
    return float(counter.get_total_flops())


def test_measured_adaptation_flops_against_a3():
    """torch's FLOP counter on a real step-2 update vs formula A3 (see docs/flops.md).

    A3 counts the backward pass of the frozen body as one more forward (gradients w.r.t. activations
    only) plus the weight gradient of the output projection at masked positions. The counter agrees
    on every dense matmul; the one gap is attention: its two s x s matmuls (4 h s^2 forward) need
    gradients w.r.t. both operands, 8 h s^2 backward, where A3 assumes 4 h s^2. So the measured count
    is A3 + 4 h s^2 per layer and sequence, exactly."""
    layers, h, s, V, B, p = 2, 128, 128, 1000, 2, 0.125
    measured = measured_adaptation_step_flops(layers, h, s, V, B, p)
    a3 = adapt_flops(layers, h, s, V, p, B, 1)
    attention_backward_extra = B * layers * 4 * h * s**2
    assert measured == pytest.approx(a3 + attention_backward_extra, rel=1e-9)
    assert 1.0 < measured / a3 < 1.25


def test_layer_shape_is_the_papers_layer_for_roberta_and_smaller_under_grouped_query_attention():
    """``LayerShape.of`` counts the layer's own matrices: RoBERTa's (MHA, a 4h GELU FFN) is the paper's 12 h^2 and h,
    so its figures are unchanged; SmolLM2-135M's (9 heads, 3 key/value heads, SwiGLU of 1536) is counted as built."""
    from minimodel.config.schema import ModelConfig
    from minimodel.flops import LayerShape, adapt_flops, layer_flops

    base = ModelConfig()  # roberta-base
    assert LayerShape.of(base) == LayerShape(12 * 768**2, 768)
    assert layer_flops(768, 512, LayerShape.of(base)) == layer_flops(768, 512)
    smol = ModelConfig(family="decoder", norm="rmsnorm", positions="rotary", activation="swiglu", bias=False,
                       vocab_size=49152, hidden=576, layers=30, heads=9, kv_heads=3, ffn=1536)
    q, kv, ffn = 576 * 576, 576 * 192, 3 * 576 * 1536  # q and o; k and v each; gate, up, down
    assert LayerShape.of(smol) == LayerShape(2 * q + 2 * kv + ffn, 576)
    mha = ModelConfig(**{**smol.to_dict(), "kv_heads": 0})
    saved = layer_flops(576, 512, LayerShape.of(mha)) - layer_flops(576, 512, LayerShape.of(smol))
    assert saved == 2 * 512 * 2 * (576 * 576 - 576 * 192)  # the narrower k and v projections
    assert adapt_flops(30, 576, 512, 49152, 1.0, 8, 1, LayerShape.of(smol)) < adapt_flops(
        30, 576, 512, 49152, 1.0, 8, 1, LayerShape.of(mha))

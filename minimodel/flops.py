"""The paper's analytic FLOP counts (appendix A.1, after Narayanan et al., 2021) and V100-days.

Symbols: ``layers`` l, ``hidden`` h, ``seq_len`` s, ``vocab`` V, ``mask_prob`` p, ``batch`` B (sequences
per update), ``updates`` U. Biases, activations, softmax and LayerNorm are left out, as in the paper.

* one layer, forward:            24 s h^2 + 4 h s^2  (in general 2 s W + 4 a s^2: W the layer's matrix weights,
                                 a its attention width; W = 12 h^2 and a = h for the paper's layer, and less for
                                 grouped-query attention, whose k and v projections are narrower: ``LayerShape``)
* MLM head, forward (masked):    p (2 s h^2 + 2 s h V)
* A1 pretraining:  3 x forward                                     = 72 UBslh^2 (1 + s/6h + p/12l + pV/12hl)
* A3 adaptation:   forward + d/d(activations) everywhere + d/d(w) of the output projection
                                                                   = 48 UBslh^2 (1 + s/6h + p/12l + pV/8hl)
* A4 MiniPost bridge: (l + 2 l_t - 1) layer passes + 2 head passes
"""

from __future__ import annotations

from dataclasses import dataclass

from minimodel.config.schema import ModelConfig

V100_FLOPS_PER_SECOND = 30e12  # the paper's estimated V100 throughput
V100_DAY = V100_FLOPS_PER_SECOND * 86_400  # 2.592e18 FLOPs


@dataclass(frozen=True)
class LayerShape:
    """What one layer's forward costs per token beyond its width: ``linear`` multiply-adds (its matrix weights) and
    the attention width ``attn`` (scores and weighted values: 2 a s each per token)."""

    linear: int
    attn: int

    @classmethod
    def of(cls, m: ModelConfig) -> LayerShape:
        """The model's layer: 12 h^2 and h for the paper's (MHA, a 4h GELU FFN), so its figures are the paper's;
        grouped-query attention, a head width apart from hidden / heads, SwiGLU and any FFN width as they are."""
        return cls(m.layer_linear, m.attn_width)


def layer_flops(hidden: int, seq_len: int, shape: LayerShape | None = None) -> float:
    """Forward FLOPs of one transformer layer for one sequence: 2 s W + 4 a s^2; the paper's layer (W = 12 h^2,
    a = h: 24 s h^2 + 4 h s^2) unless ``shape``."""
    shape = shape or LayerShape(12 * hidden**2, hidden)
    return 2 * seq_len * shape.linear + 4 * shape.attn * seq_len**2


def lm_head_flops(hidden: int, seq_len: int, vocab: int, mask_prob: float) -> float:
    """Forward FLOPs of one MLM head (dense + output projection) over the masked positions of one sequence."""
    return mask_prob * (2 * seq_len * hidden**2 + 2 * seq_len * hidden * vocab)


def outproj_flops(hidden: int, seq_len: int, vocab: int) -> float:
    return 2 * seq_len * hidden * vocab


def pretrain_flops(layers: int, hidden: int, seq_len: int, vocab: int, mask_prob: float, batch: int,
                   updates: int, extra_heads: int = 0, shape: LayerShape | None = None) -> float:
    """A1: forward + backward (x3) of the whole model. ``extra_heads`` counts MiniJoint's secondary heads,
    each adding the cost of one more MLM head (the paper's 30.4 vs 32.2 V100-days, footnote 2)."""
    forward = layers * layer_flops(hidden, seq_len, shape) + (1 + extra_heads) * lm_head_flops(hidden, seq_len, vocab, mask_prob)
    return 3.0 * updates * batch * forward


def adapt_flops(layers: int, hidden: int, seq_len: int, vocab: int, mask_prob: float, batch: int,
                updates: int, shape: LayerShape | None = None) -> float:
    """A3: U B (2 l FLOP_layer + 2 FLOP_lm + p FLOP_outproj). Only embeddings (tied to the output
    projection) and the output bias train: activations' gradients everywhere, weight gradients only
    for the output projection."""
    per_seq = (2 * layers * layer_flops(hidden, seq_len, shape) + 2 * lm_head_flops(hidden, seq_len, vocab, mask_prob)
               + mask_prob * outproj_flops(hidden, seq_len, vocab))
    return float(updates) * batch * per_seq


def bridge_flops(layers: int, hidden: int, seq_len: int, vocab: int, mask_prob: float, batch: int,
                 updates: int, trainable_layers: int, shape: LayerShape | None = None, affine: bool = False,
                 teacher_layers: int = 0) -> float:
    """A4: MiniPost step 1b over an ``layers``-layer mini-model whose top ``trainable_layers`` train.

    Beyond the paper (docs/extensions.md): ``affine`` (``bridge.init=affine``), a trained h x h map below the
    bridge layers: its forward and weight gradient (2 s h^2 each), and the lowest bridge layer now needs its input
    gradient too (one more FLOP_layer); ``teacher_layers`` (``bridge.objective=distill``), the forward pass of the
    frozen source model the mini-model is distilled from (its layers and its LM head over the scored positions)."""
    if not 1 <= trainable_layers <= layers:
        raise ValueError(f"trainable_layers must be in 1..{layers}, got {trainable_layers}")
    if teacher_layers < 0:
        raise ValueError(f"teacher_layers must be 0 (no teacher) or a positive depth, got {teacher_layers}")
    layer = layer_flops(hidden, seq_len, shape)
    per_seq = (layers + 2 * trainable_layers - 1) * layer + 2 * lm_head_flops(hidden, seq_len, vocab, mask_prob)
    if affine:
        per_seq += layer + 4 * seq_len * hidden**2
    if teacher_layers:
        per_seq += teacher_layers * layer + lm_head_flops(hidden, seq_len, vocab, mask_prob)
    return float(updates) * batch * per_seq


def v100_days(flops: float) -> float:
    return flops / V100_DAY


class FlopSchedule:
    """Cumulative FLOPs of a run whose cost per update changes at given updates (progressive adaptation):
    ``segments`` = ((first update, end update, FLOPs per update), ...), contiguous from 0; the last rate
    continues past its end."""

    def __init__(self, segments: list[tuple[int, int, float]]) -> None:
        if not segments or segments[0][0] != 0 or any(a[1] != b[0] for a, b in zip(segments, segments[1:])):
            raise ValueError(f"segments must be contiguous from update 0, got {segments}")
        self.segments = [(int(s), int(e), float(f)) for s, e, f in segments]

    @classmethod
    def constant(cls, per_update: float) -> FlopSchedule:
        return cls([(0, 1, per_update)])

    def at(self, step: int) -> float:
        """FLOPs of the first ``step`` updates: the sum over the segments they cross."""
        total = 0.0
        for i, (start, end, rate) in enumerate(self.segments):
            stop = step if i == len(self.segments) - 1 else min(step, end)
            total += max(0, stop - start) * rate
        return total

    def rate(self, step: int) -> float:
        """FLOPs of update ``step + 1`` (the one made after ``step`` updates)."""
        return next((f for _, e, f in self.segments if step < e), self.segments[-1][2])

"""What the source model's own states say about a mini-model, before any training: the least-squares affine map of
``bridge.init=affine``, the per-layer redundancy of ``minimodel layers``, and the loss of a mini-model at step 0.

A mini-model of depth N keeps the source's layers 1..N and puts ``k`` bridge layers between layer N and the output
head. ``bridge.init=affine`` makes those the source's own top k layers (``copy``) and puts before them one affine map
``A h + b`` fitted so that layer N's state lands where layer L - k's state would be: the closed-form least squares
over a few thousand tokens of the source language (ReplaceMe, Shopkhoev et al., arXiv 2505.02819, fits the same kind
of map to stand in for pruned blocks; the tuned lens, Belrose et al., arXiv 2303.08112, reads layer states through
affine maps). Every function works on both families (``hidden_states``, ``heads``, ``final_state``) and reads no
files: the blocks of token ids come from the caller."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minimodel.models.model import IGNORE_INDEX, PRIMARY

RIDGE = 1e-6  # relative ridge of the normal equations: a scale-free floor under their smallest eigenvalues


@torch.no_grad()
def layer_states(model: nn.Module, blocks: Sequence[Tensor], depths: Sequence[int], batch: int = 8
                 ) -> dict[int, Tensor]:
    """The hidden states after each layer in ``depths`` (0: the embeddings' output) at every position of ``blocks``
    (token-id rows of one length), as float32 rows (positions, hidden) in block order; the model in eval mode."""
    was_training = model.training
    model.eval()
    try:
        out: dict[int, list[Tensor]] = {d: [] for d in depths}
        for i in range(0, len(blocks), batch):
            ids = torch.stack(list(blocks[i:i + batch]))
            states = model.hidden_states(ids, list(depths), padded=False)
            for d in depths:
                out[d].append(states[d].float().flatten(0, 1))
        return {d: torch.cat(v) for d, v in out.items()}
    finally:
        model.train(was_training)


@dataclass(frozen=True)
class AffineFit:
    weight: Tensor  # (hidden, hidden): the map as an ``nn.Linear``'s weight (out x in)
    bias: Tensor  # (hidden,)
    r2: float  # the share of the target states' variance the map explains on the tokens it was fitted on
    tokens: int

    def apply(self, x: Tensor) -> Tensor:
        return x @ self.weight.T.to(x.dtype) + self.bias.to(x.dtype)


def fit_affine(x: Tensor, y: Tensor, ridge: float = RIDGE) -> AffineFit:
    """The affine map ``y ~ A x + b`` of least squared error over the rows of ``x`` and ``y`` (tokens, hidden), in
    float64 by the normal equations of the centred data with a ridge of ``ridge`` times the mean diagonal (so a
    rank-deficient ``x``, as with fewer tokens than dimensions, still gives a unique map)."""
    if x.shape[0] != y.shape[0] or x.ndim != 2 or y.ndim != 2:
        raise ValueError(f"x and y must be (tokens, hidden) with the same rows, got {tuple(x.shape)}, {tuple(y.shape)}")
    if x.shape[0] < 2:
        raise ValueError(f"an affine fit needs at least 2 tokens, got {x.shape[0]}")
    x64, y64 = x.double(), y.double()
    mx, my = x64.mean(0), y64.mean(0)
    xc, yc = x64 - mx, y64 - my
    gram = xc.T @ xc
    gram += torch.eye(gram.shape[0], dtype=gram.dtype) * (ridge * float(gram.diagonal().mean().clamp_min(1e-12)))
    a = torch.linalg.solve(gram, xc.T @ yc)  # (in, out)
    residual = yc - xc @ a
    total = float((yc**2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    weight = a.T.contiguous().float()
    return AffineFit(weight, (my - mx @ a).float(), r2, int(x.shape[0]))


@torch.no_grad()
def mean_lm_loss(model: nn.Module, blocks: Sequence[Tensor], labels: Sequence[Tensor], batch: int = 8) -> float:
    """Token-weighted mean loss of the model's primary head over ``blocks`` and their ``labels`` (-100: not scored),
    float32, eval mode: what the stage's validation reports, before any update."""
    was_training = model.training
    model.eval()
    try:
        total, n = 0.0, 0
        for i in range(0, len(blocks), batch):
            ids, lab = torch.stack(list(blocks[i:i + batch])), torch.stack(list(labels[i:i + batch]))
            count = int(lab.ne(IGNORE_INDEX).sum())
            if count:
                total += float(model.lm_losses(ids, lab, [PRIMARY])[PRIMARY]) * count
                n += count
        return total / n if n else math.nan
    finally:
        model.train(was_training)


@torch.no_grad()
def agreement(student: nn.Module, teacher: nn.Module, blocks: Sequence[Tensor], labels: Sequence[Tensor],
              batch: int = 8) -> dict[str, float]:
    """How closely ``student`` (a mini-model) follows ``teacher`` (its source) on ``blocks``, at the positions
    ``labels`` scores: token-weighted means of KL(teacher || student) of the two output distributions (the quantity
    ``bridge.objective=distill`` trains, as ``distill_losses`` computes it) and of the student's LM loss, and the share
    of positions where both rank the same token first. Float32, eval mode. A bridge's LM loss says how well it
    predicts the text; this says how much it computes what the model its embeddings are plugged into computes."""
    modes = student.training, teacher.training
    student.eval()
    teacher.eval()
    try:
        kl = lm = 0.0
        same = n = 0
        for i in range(0, len(blocks), batch):
            ids, lab = torch.stack(list(blocks[i:i + batch])), torch.stack(list(labels[i:i + batch]))
            where = lab.ne(IGNORE_INDEX)
            logp = []
            for m in (student, teacher):
                h = m.hidden_states(ids, [m.cfg.layers], padded=False)[m.cfg.layers][where]
                logp.append(F.log_softmax(m.heads[PRIMARY](h).float(), dim=-1))
            kl += float(F.kl_div(logp[0], logp[1], log_target=True, reduction="sum"))
            lm += float(F.nll_loss(logp[0], lab[where], reduction="sum"))
            same += int(logp[0].argmax(-1).eq(logp[1].argmax(-1)).sum())
            n += int(where.sum())
        if not n:
            return {"kl": math.nan, "lm_loss": math.nan, "top1_agreement": math.nan, "tokens": 0}
        return {"kl": kl / n, "lm_loss": lm / n, "top1_agreement": same / n, "tokens": n}
    finally:
        student.train(modes[0])
        teacher.train(modes[1])


@dataclass(frozen=True)
class LayerRow:
    layer: int  # 1..L
    block_influence: float  # ShortGPT: 1 - mean cos(input of layer l, its output)
    angular_to_last: float  # Gromov et al.: mean arccos(cos(state after layer l, state after layer L)) / pi
    affine_loss: float  # step-0 loss of the affine mini-model of depth l (nan where it cannot be built)
    affine_r2: float


@torch.no_grad()
def layer_table(model: nn.Module, fit_blocks: Sequence[Tensor], val_blocks: Sequence[Tensor],
                val_labels: Sequence[Tensor], bridge_layers: int) -> tuple[list[LayerRow], float]:
    """Per layer of ``model``: its block influence and angular distance to the last layer on ``val_blocks``, and the
    step-0 loss on them of the mini-model of that depth under ``bridge.init=affine`` (the map fitted on
    ``fit_blocks``, then the top ``bridge_layers`` layers and the head). Returns the rows and the full model's loss.

    The full model runs once over each set of blocks; a mini-model of depth N costs only its k copied layers and
    its head on top of the stored states."""
    was_training = model.training
    model.eval()
    try:
        return _layer_table(model, fit_blocks, val_blocks, val_labels, bridge_layers)
    finally:
        model.train(was_training)


def _layer_table(model: nn.Module, fit_blocks: Sequence[Tensor], val_blocks: Sequence[Tensor],
                 val_labels: Sequence[Tensor], bridge_layers: int) -> tuple[list[LayerRow], float]:
    layers = model.cfg.layers
    top = layers - bridge_layers
    every = list(range(layers + 1))
    fit = layer_states(model, fit_blocks, every) if top >= 1 else {}
    val = layer_states(model, val_blocks, every)
    full_loss = mean_lm_loss(model, val_blocks, val_labels)
    labels = torch.stack(list(val_labels)).flatten()
    scored = labels.ne(IGNORE_INDEX)
    rows = []
    shape = (len(val_blocks), val_blocks[0].shape[0], model.cfg.hidden)
    for n in range(1, layers + 1):
        influence = 1.0 - float(F.cosine_similarity(val[n - 1], val[n], dim=-1).mean())
        cos = F.cosine_similarity(val[n], val[layers], dim=-1).clamp(-1.0, 1.0)
        angular = float(torch.arccos(cos).mean() / math.pi)
        loss, r2 = math.nan, math.nan
        if 1 <= n <= top:
            fitted = fit_affine(fit[n], fit[top])
            r2 = fitted.r2
            x = fitted.apply(val[n]).view(shape)
            for layer in model.layers[top:]:
                x = layer(x, None)  # MLM blocks and LM blocks are never padded
            logits = model.heads[PRIMARY](x.flatten(0, 1)[scored])
            loss = float(F.cross_entropy(logits.float(), labels[scored]))
        rows.append(LayerRow(n, influence, angular, loss, r2))
    return rows, full_loss

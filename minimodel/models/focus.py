"""FOCUS (Dobler & de Melo, "FOCUS: Effective Embedding Initialization for Monolingual Specialization of Multilingual
Models", EMNLP 2023): ``adapt.init=focus``.

A target piece that also exists in the source vocabulary copies its source embedding (as the overlap initialisation
does). Every other piece t with an auxiliary vector (``data.aux_embeddings``: fastText trained on the target text)
becomes a convex combination of the overlapping pieces' source embeddings:

    c_j = cos(aux(t), aux(o_j))   for the overlapping pieces o_j that have an auxiliary vector,
    w   = sparsemax(c)            (Martins & Astudillo, ICML 2016), over the ``top_k`` largest c_j when top_k > 0,
    e_t = sum_j w_j * e_src(o_j)

and its output bias the same mix of their source biases (overlapping pieces copy theirs). Pieces without an auxiliary
vector (specials, pieces fastText saw fewer than ``min_count`` times) keep N(0, init_std) as in the overlap
initialisation (FOCUS's code draws those from the source embeddings' per-dimension mean and std instead) with output
bias 0. Written from the paper and the description of its code, not copied from it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from minimodel.models.surgery import overlap_init

CHUNK = 512  # new pieces scored at once: a (CHUNK, overlapping pieces) similarity matrix
MIX = 64  # support columns mixed at once: a (CHUNK, MIX, hidden) gather


def sparsemax(z: Tensor) -> Tensor:
    """Sparsemax of each row of ``z``: the Euclidean projection onto the probability simplex,
    ``p_i = max(z_i - tau, 0)`` with ``tau`` such that the ``p_i`` sum to 1. With ``z`` sorted in decreasing order the
    support is its first ``k`` entries, ``k`` the largest with ``1 + k z_(k) > z_(1) + ... + z_(k)``, and
    ``tau = (z_(1) + ... + z_(k) - 1) / k``."""
    ranked, _ = torch.sort(z, dim=-1, descending=True)
    ks = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    cumulative = ranked.cumsum(-1)
    k = ((1 + ks * ranked > cumulative) * ks).amax(-1, keepdim=True)  # the support is a prefix of the ranking
    tau = (cumulative.gather(-1, k.long() - 1) - 1) / k
    return torch.clamp(z - tau, min=0)


def mix_weights(similarity: Tensor, top_k: int = 0) -> tuple[Tensor, Tensor]:
    """For each row of ``similarity`` (new pieces x overlapping pieces): the columns ranked by similarity (ties: the
    lower column first), the first ``top_k`` of them (every column when 0), and their sparsemax weights, cut to the
    longest support of the rows. Returns (columns, weights), both (rows, support)."""
    values, columns = torch.sort(similarity, dim=1, descending=True, stable=True)
    if top_k > 0:
        values, columns = values[:, :top_k], columns[:, :top_k]
    weights = sparsemax(values)
    support = max(int((weights > 0).sum(1).max()), 1) if len(weights) else 0
    return columns[:, :support], weights[:, :support]


@dataclass
class FocusInit:
    weight: Tensor  # (V_trg, hidden)
    bias: Tensor  # (V_trg,)
    rows: Tensor  # per target piece: the source row it copies (-1: not copied)
    mixed: Tensor  # per target piece: initialised by FOCUS
    info: dict = field(default_factory=dict)  # counts, support sizes, seconds

    @property
    def copied(self) -> int:
        return int((self.rows >= 0).sum())


def focus_init(source: Tensor, source_bias: Tensor, source_pieces: Sequence[str | None],
               target_pieces: Sequence[str | None], aux: Tensor, std: float = 0.02,
               generator: torch.Generator | None = None, top_k: int = 0) -> FocusInit:
    """Target embeddings and output bias by FOCUS (see the module docstring). ``aux``: one auxiliary vector per target
    piece, a zero row where it has none. Every random draw is the overlap initialisation's (same generator, same
    order), so a piece FOCUS does not mix gets exactly what ``overlap_init`` gives it."""
    start = time.perf_counter()
    weight, rows = overlap_init(source, source_pieces, target_pieces, std, generator)
    bias = torch.zeros(len(target_pieces), dtype=source_bias.dtype)
    copied = rows >= 0
    bias[copied] = source_bias.detach()[rows[copied]].to(bias.dtype)
    norms = aux.double().norm(dim=1)
    has_aux = norms > 0
    anchors = torch.nonzero(copied & has_aux).flatten()
    new = torch.nonzero(~copied & has_aux).flatten()
    mixed = torch.zeros(len(target_pieces), dtype=torch.bool)
    supports: list[Tensor] = []
    if len(anchors) and len(new):
        unit = aux.double() / norms.clamp_min(1e-12).unsqueeze(1)
        anchor_emb = source.detach().double()[rows[anchors]]
        anchor_bias = source_bias.detach().double()[rows[anchors]]
        for lo in range(0, len(new), CHUNK):
            ids = new[lo:lo + CHUNK]
            columns, w = mix_weights(unit[ids] @ unit[anchors].T, top_k)
            emb = torch.zeros(len(ids), source.shape[1], dtype=torch.float64)
            for c in range(0, columns.shape[1], MIX):
                cols, ws = columns[:, c:c + MIX], w[:, c:c + MIX]
                emb += torch.einsum("mj,mjh->mh", ws, anchor_emb[cols])
            weight[ids] = emb.to(weight.dtype)
            bias[ids] = (w * anchor_bias[columns]).sum(1).to(bias.dtype)
            supports.append((w > 0).sum(1))
        mixed[new] = True
    support = torch.cat(supports) if supports else torch.zeros(0, dtype=torch.long)
    info = {"copied": int(copied.sum()), "mixed": int(mixed.sum()), "random": int((~copied & ~mixed).sum()),
            "anchors": len(anchors), "top_k": top_k,
            "support_mean": round(float(support.double().mean()), 3) if len(support) else 0.0,
            "support_max": int(support.max()) if len(support) else 0,
            "seconds": round(time.perf_counter() - start, 3)}
    return FocusInit(weight, bias, rows, mixed, info)

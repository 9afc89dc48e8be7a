"""The RoBERTa encoder with masked-LM heads at chosen depths.

One file, no Lightning, no files, no languages. The architecture follows fairseq / Hugging Face
RoBERTa: learned positions with RoBERTa's padding offset, post-LayerNorm blocks, exact GELU,
and an MLM head (dense -> GELU -> LayerNorm -> projection tied to the token embeddings + bias).

Heads are data: ``ModelConfig.mini_heads = [4]`` adds a second MLM head after layer 4 (MiniJoint).
The primary head is always called ``"primary"`` and sits after the last layer; a secondary head
after layer N is called ``f"l{N}"``. Running a head only computes the layers below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from minimodel.config.schema import PRIMARY, ModelConfig

IGNORE_INDEX = -100

__all__ = ["PRIMARY", "IGNORE_INDEX", "POOLS", "ModelConfig", "RobertaMLM", "ClassificationHead", "SpanHead", "pool",
           "task_logits", "head_losses"]


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.pad_id = cfg.pad_id
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden, padding_idx=cfg.pad_id)
        self.positions = nn.Embedding(cfg.max_positions, cfg.hidden, padding_idx=cfg.pad_id)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: Tensor) -> Tensor:
        not_pad = input_ids.ne(self.pad_id)
        positions = torch.cumsum(not_pad, dim=1) * not_pad + self.pad_id  # (B, T): pad -> pad_id
        x = self.tokens(input_ids) + self.positions(positions)  # (B, T, C)
        return self.dropout(self.norm(x))


class Layer(nn.Module):
    """Post-LayerNorm transformer block (BERT/RoBERTa)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.attn_dropout = cfg.attn_dropout
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.attn_out = nn.Linear(cfg.hidden, cfg.hidden)
        self.attn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.ffn_in = nn.Linear(cfg.hidden, cfg.ffn)
        self.ffn_out = nn.Linear(cfg.ffn, cfg.hidden)
        self.ffn_norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, attn_mask: Tensor | None) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # 3 x (B, H, T, D)
        p = self.attn_dropout if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)  # (B, H, T, D)
        a = a.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        x = self.attn_norm(x + self.dropout(self.attn_out(a)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(F.gelu(self.ffn_in(x)))))


class MLMHead(nn.Module):
    """dense -> GELU -> LayerNorm -> projection to the vocabulary (weight tied to the embeddings) + bias."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.decoder = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)  # weight replaced by the tie
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.norm(F.gelu(self.dense(x)))) + self.bias  # (..., V)


POOLS = ("first", "last", "mean")


def pool(h: Tensor, how: str, attention_mask: Tensor | None = None) -> Tensor:
    """One vector per row of ``h`` (B, T, C) -> (B, C): ``first`` reads position 0 (<s>), ``last`` the last real
    token (right padding: ``attention_mask`` (B, T) says which are real; none: every position), ``mean`` the mean
    over the real tokens (padding counts for nothing: a padded row pools as it does unpadded)."""
    if how == "first":
        return h[:, 0]  # (B, C)
    if how == "mean":
        if attention_mask is None:
            return h.mean(1)  # (B, C)
        real = attention_mask.to(h.device, torch.bool)[:, :, None]  # (B, T, 1)
        total = h.float().masked_fill(~real, 0).sum(1)  # (B, C), in fp32 (a bf16 sum of hundreds of tokens rounds)
        return (total / real.sum(1).clamp(min=1)).to(h.dtype)  # (B, C)
    last = (attention_mask.sum(1) - 1 if attention_mask is not None
            else torch.full((h.shape[0],), h.shape[1] - 1, device=h.device))
    return h[torch.arange(h.shape[0], device=h.device), last.to(h.device)]  # (B, C)


class ClassificationHead(nn.Module):
    """RoBERTa's sentence(-pair) classification head (dense -> tanh -> out) over one vector per row: ``pooling``
    "first" reads <s> (RoBERTa), "last" the last real token of each row (a causal LM: the only position that has
    seen the whole input), "mean" the mean over the real tokens (``pool``). ``layer``: the body's layer whose
    hidden states it reads (0: the last; ``task_logits`` asks the body for them), not a parameter."""

    def __init__(self, hidden: int, num_labels: int, dropout: float, pooling: str = "first", layer: int = 0) -> None:
        super().__init__()
        if pooling not in POOLS:
            raise ValueError(f"pooling must be one of {', '.join(POOLS)}, got {pooling!r}")
        self.pooling, self.layer = pooling, layer
        self.dense = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(hidden, num_labels)

    def forward(self, h: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        x = pool(h, self.pooling, attention_mask)  # (B, C)
        return self.out(self.dropout(torch.tanh(self.dense(self.dropout(x)))))  # (B, num_labels)


class SpanHead(nn.Module):
    """Extractive QA head: start and end logits per token (of the body's layer ``layer``; 0: the last)."""

    def __init__(self, hidden: int, layer: int = 0) -> None:
        super().__init__()
        self.layer = layer
        self.out = nn.Linear(hidden, 2)

    def forward(self, h: Tensor, attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        start, end = self.out(h).unbind(dim=-1)  # (B, T) each
        return start, end


def affine_map(cfg: ModelConfig) -> nn.Linear | None:
    """The affine map of the residual stream after layer ``cfg.affine_after`` (both families; None without one),
    initialised to the identity: until fitted or trained it changes nothing. Made after every other module, so a
    model without it draws the same initial weights as before it existed."""
    if not cfg.affine_after:
        return None
    affine = nn.Linear(cfg.hidden, cfg.hidden)
    with torch.no_grad():
        affine.weight.copy_(torch.eye(cfg.hidden))
        affine.bias.zero_()
    return affine


def task_logits(body: nn.Module, head: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                padded: bool | None = None) -> Any:
    """A task head on the body's hidden states at the head's ``layer`` (``encode``: only the layers up to it are
    computed): what steps 3 and 4 both run."""
    return head(body.encode(input_ids, padded=padded, layer=getattr(head, "layer", 0)), attention_mask)


class RobertaMLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.heads = nn.ModuleDict({name: MLMHead(cfg) for name in cfg.head_names})
        self.apply(self._init_weights)
        self.tie_weights()
        self.affine = affine_map(cfg)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.cfg.init_std
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None:
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def tie_weights(self) -> None:
        """The one place where every MLM head's output projection is tied to the token embeddings."""
        for head in self.heads.values():
            head.decoder.weight = self.embeddings.tokens.weight

    @property
    def token_embeddings(self) -> nn.Embedding:
        return self.embeddings.tokens

    def attention_mask(self, input_ids: Tensor, padded: bool | None = None) -> Tensor | None:
        """Boolean key mask (B, 1, 1, T), or None when nothing is padded (lets SDPA take the fast path).

        ``padded``: whether the batch holds padding, when the caller knows it (an MLM block never does; a task
        batch's collate says so): no host sync. None: found out from the ids (one host sync)."""
        not_pad = input_ids.ne(self.cfg.pad_id)
        if padded is None:
            padded = not bool(not_pad.all())
        return not_pad[:, None, None, :] if padded else None

    def hidden_states(self, input_ids: Tensor, depths: Sequence[int] | None = None,
                      padded: bool | None = None) -> dict[int, Tensor]:
        """Hidden states after each layer in ``depths`` (default: the last layer).

        Layers above ``max(depths)`` are not computed. Depth 0 is the embedding output. ``padded``: see
        ``attention_mask``.
        """
        wanted = sorted(set(depths)) if depths is not None else [self.cfg.layers]
        if not wanted or wanted[0] < 0 or wanted[-1] > self.cfg.layers:
            raise ValueError(f"depths must lie in 0..{self.cfg.layers}, got {list(depths or [])}")
        mask = self.attention_mask(input_ids, padded)
        x = self.embeddings(input_ids)  # (B, T, C)
        out: dict[int, Tensor] = {0: x} if wanted[0] == 0 else {}
        for i, layer in enumerate(self.layers[: wanted[-1]], start=1):
            x = layer(x, mask)
            if i == self.cfg.affine_after and self.affine is not None:  # layer i's state is the mapped one
                x = self.affine(x)
            if i in wanted:
                out[i] = x
        return out

    def encode(self, input_ids: Tensor, padded: bool | None = None, layer: int = 0) -> Tensor:
        """Hidden states (B, T, C) after layer ``layer`` (0: the last); layers above it are not computed. RoBERTa's
        post-norm blocks end with their own LayerNorm: no norm is added."""
        depth = layer or self.cfg.layers
        return self.hidden_states(input_ids, [depth], padded=padded)[depth]

    def final_state(self, h: Tensor) -> Tensor:
        """The last layer's state as ``encode`` gives it (post-norm layers: already normalised)."""
        return h

    def mlm_logits(self, input_ids: Tensor, masked: Tensor | None = None, head: str = PRIMARY) -> Tensor:
        """Logits of one head: (N_masked, V) at the positions where ``masked`` is True, else (B, T, V)."""
        h = self.hidden_states(input_ids, [self.cfg.head_depth(head)])[self.cfg.head_depth(head)]
        if masked is not None:
            h = h[masked]  # (N, C): only masked positions reach the head
        return self.heads[head](h)

    def mlm_losses(self, input_ids: Tensor, labels: Tensor, heads: Sequence[str] | None = None) -> dict[str, Tensor]:
        """Mean cross-entropy over masked positions (labels != -100) for each head asked for.

        Only the layers up to the deepest head asked for are computed, and only the masked
        positions are projected onto the vocabulary. MLM blocks are never padded (no attention mask), and the
        masked positions are found once for every head: one host sync (their count) per call.
        """
        return head_losses(self, input_ids, labels, heads)

    def lm_losses(self, input_ids: Tensor, labels: Tensor, heads: Sequence[str] | None = None) -> dict[str, Tensor]:
        """The name every family's model answers to (what the training module calls): here the MLM losses."""
        return self.mlm_losses(input_ids, labels, heads)

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Unique parameters (the tied projection counts once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)


def head_losses(model: nn.Module, input_ids: Tensor, labels: Tensor, heads: Sequence[str] | None = None
                ) -> dict[str, Tensor]:
    """Mean cross-entropy at the positions where ``labels`` != -100 for each head asked for (default: every head of
    ``model``), computing the layers up to the deepest of them once; only those positions reach the heads. The
    blocks are never padded. One host sync (the count of labelled positions) per call."""
    cfg = model.cfg
    names = list(heads) if heads is not None else cfg.head_names
    depth_of = {name: cfg.head_depth(name) for name in names}
    states = model.hidden_states(input_ids, list(depth_of.values()), padded=False)
    where = labels.flatten().ne(IGNORE_INDEX).nonzero().squeeze(1)  # (N,): the labelled positions of B*T
    targets = labels.flatten().index_select(0, where)  # (N,)
    losses = {}
    for name, depth in depth_of.items():
        h = states[depth].flatten(0, 1).index_select(0, where)  # (N, C): only labelled positions reach the head
        losses[name] = F.cross_entropy(model.heads[name](h).float(), targets)  # logits (N, V)
    return losses

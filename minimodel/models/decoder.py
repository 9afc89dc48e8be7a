"""A decoder-only causal LM with LM heads at chosen depths (``model.family: decoder``).

One file, no Lightning, no files, no languages; the same contract as ``model.RobertaMLM`` (``embeddings.tokens``,
``layers``, ``heads`` named ``primary`` / ``l{N}``, ``tie_weights``, ``hidden_states``, ``encode``, ``lm_losses``), so
surgery, stages and evaluation work on it unchanged. The architecture covers GPT-2 and the Llama family as shipped
(Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2):

* pre-norm blocks (``model.norm``: LayerNorm, or RMSNorm), causal attention through
  ``scaled_dot_product_attention(is_causal=True)``, positions learned (``model.positions: learned``, GPT-2) or rotary
  (``rotary``, Llama's ``rotate_half`` layout), an FFN with GELU, GPT-2's tanh GELU or SwiGLU (``model.activation``),
  biases or none (``model.bias``), or on q, k, v only (``model.qkv_bias``, Qwen2);
* grouped-query attention (``model.kv_heads``), a head width apart from hidden / heads (``model.head_size``), rope theta
  and the rope scalings ``linear`` and ``llama3`` (``model.rope_scaling``), an RMSNorm over each head's queries and keys
  (``model.qk_norm``, Qwen3); a sliding attention window (``model.sliding_window``, Mistral) needs no code: the
  configuration refuses a sequence longer than the window, and within it the window is the full causal mask;
* an LM head after layer N (``model.mini_heads``) is the final norm of its own and the output projection, so running
  it computes only layers 1..N; the output projection is the token embeddings (``model.tie_embeddings: true``) or
  one matrix of its own shared by every head (false: it lives in ``heads.primary.decoder``); no output bias.

Padding: task batches are right-padded (``data.task_features.pad_collate``), so under the causal mask a real token
only ever attends to earlier real tokens and no padding mask is needed; the outputs at padded positions are never
read (the classification head reads the last real token, the LM loss only labelled positions)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from minimodel.config.schema import PRIMARY, ModelConfig
from minimodel.models.model import affine_map, head_losses


def norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden, eps=cfg.layer_norm_eps)
    return nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps, bias=cfg.bias)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_inv_freq(cfg: ModelConfig) -> Tensor:
    """The rotary frequencies of one head (D/2,): theta^(-2i/D), then the model's rope scaling. ``linear`` divides every
    frequency by the factor (positions read as t / factor). ``llama3`` (Llama 3.1) divides only the low frequencies,
    those whose wavelength exceeds ``rope_original_max_positions / low_freq_factor``, keeps those whose wavelength is
    below ``... / high_freq_factor``, and between the two blends the divided and the kept frequency linearly in
    ``original / wavelength``: the same numbers as transformers' ``rope_type`` of those names."""
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    if cfg.rope_scaling == "linear":
        return inv_freq / cfg.rope_factor
    if cfg.rope_scaling == "llama3":
        factor, low, high = cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
        original = cfg.rope_original_max_positions
        wavelength = 2 * math.pi / inv_freq
        smooth = (original / wavelength - low) / (high - low)  # < 0: low frequency, > 1: high frequency
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        scaled = torch.where(wavelength > original / low, inv_freq / factor, inv_freq)
        medium = (wavelength >= original / high) & (wavelength <= original / low)
        return torch.where(medium, blended, scaled)
    return inv_freq


class Rotary(nn.Module):
    """Rotary position embeddings (Su et al., 2021) in the layout of Hugging Face's Llama (halves, not pairs)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(cfg), persistent=False)

    def forward(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q (B, H, T, D), k (B, KV, T, D), positions 0..T-1."""
        t = torch.arange(q.shape[-2], device=q.device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq.to(q.device))  # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


SDPA_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # scaled_dot_product_attention(enable_gqa)


def native_gqa(q: Tensor) -> bool:
    """Grouped-query attention without copying k and v to every query head: the attention kernel's own
    ``enable_gqa`` (torch 2.5+), on the CPU, where it was measured faster (benchmarks/bench_real_adapt.py); CUDA
    keeps the copies until the GPU check measures it there."""
    return SDPA_GQA and q.device.type == "cpu"


def cpu_bf16_backward(q: Tensor) -> bool:
    """A bf16 attention on the CPU that will be differentiated: run in fp32 (torch's CPU flash-attention backward
    took 33-43 ms in bf16 against 15-23 ms in fp32 at SmolLM2's shapes); the result is cast back to bf16."""
    return q.device.type == "cpu" and q.dtype == torch.bfloat16 and q.requires_grad


class Embeddings(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.positions = nn.Embedding(cfg.max_positions, cfg.hidden) if cfg.positions == "learned" else None
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids: Tensor) -> Tensor:
        x = self.tokens(input_ids)  # (B, T, C)
        if self.positions is not None:
            x = x + self.positions(torch.arange(input_ids.shape[1], device=input_ids.device))
        return self.dropout(x)


class Layer(nn.Module):
    """Pre-norm causal transformer block. Attention has ``heads`` query heads and ``key_value_heads`` key/value heads
    (fewer: grouped-query attention, each key/value head serving ``heads / key_value_heads`` query heads), all of
    width ``head_dim``; one projection computes [q; k; v] (widths attn_width, kv_width, kv_width)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.key_value_heads, cfg.head_dim
        self.attn_dropout, self.activation = cfg.attn_dropout, cfg.activation
        self.split = (cfg.attn_width, cfg.kv_width, cfg.kv_width)
        self.attn_norm = norm(cfg)
        self.qkv = nn.Linear(cfg.hidden, sum(self.split), bias=cfg.bias or cfg.qkv_bias)
        if cfg.qk_norm:  # Qwen3: one RMSNorm over head_dim, shared by the heads, on queries and on keys
            self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.layer_norm_eps)
            self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.layer_norm_eps)
        self.attn_out = nn.Linear(cfg.attn_width, cfg.hidden, bias=cfg.bias)
        self.ffn_norm = norm(cfg)
        gated = cfg.activation == "swiglu"
        self.ffn_in = nn.Linear(cfg.hidden, (2 if gated else 1) * cfg.ffn, bias=cfg.bias)  # swiglu: [gate; up]
        self.ffn_out = nn.Linear(cfg.ffn, cfg.hidden, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)
        self.rotary = Rotary(cfg) if cfg.positions == "rotary" else None

    def ffn(self, x: Tensor) -> Tensor:
        if self.activation == "swiglu":  # two products over the halves of [gate; up]: no (T x 2f) cat in backward
            w, b, f = self.ffn_in.weight, self.ffn_in.bias, self.ffn_out.in_features
            gate = F.linear(x, w[:f], None if b is None else b[:f])
            up = F.linear(x, w[f:], None if b is None else b[f:])
            return self.ffn_out(F.silu(gate) * up)
        h = self.ffn_in(x)
        return self.ffn_out(F.gelu(h, approximate="tanh" if self.activation == "gelu_tanh" else "none"))

    def attention(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        q, k, v = self.qkv(x).split(self.split, dim=-1)
        q = q.view(B, T, self.heads, self.head_dim)  # (B, T, H, D)
        k = k.view(B, T, self.kv_heads, self.head_dim)  # (B, T, KV, D)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, KV, T, D)
        if self.rotary is not None:
            q, k = self.rotary(q, k)
        native = native_gqa(q)
        if self.kv_heads != self.heads and not native:  # each key/value head repeated for its group of query heads
            group = self.heads // self.kv_heads
            k, v = (t[:, :, None].expand(B, self.kv_heads, group, T, self.head_dim).reshape(B, self.heads, T,
                                                                                          self.head_dim)
                    for t in (k, v))
        p = self.attn_dropout if self.training else 0.0
        gqa = {"enable_gqa": True} if native and self.kv_heads != self.heads else {}
        if cpu_bf16_backward(q):  # the CPU's bf16 flash-attention backward is slower than its fp32 one
            with torch.autocast("cpu", enabled=False):
                a = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), dropout_p=p, is_causal=True,
                                                   **gqa).to(q.dtype)  # (B, H, T, D)
        else:
            a = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, **gqa)  # (B, H, T, D)
        return self.attn_out(a.transpose(1, 2).reshape(B, T, self.heads * self.head_dim))

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        """``attn_mask``: the encoder layer's contract; unused (causal, right-padded: see the module docstring)."""
        x = x + self.dropout(self.attention(self.attn_norm(x)))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class LMHead(nn.Module):
    """The final norm of a head's depth, then the projection to the vocabulary (no bias)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm = norm(cfg)
        self.decoder = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)  # tied: see DecoderLM.tie_weights

    def forward(self, x: Tensor) -> Tensor:
        return self.decoder(self.norm(x))  # (..., V)


class DecoderLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))
        self.heads = nn.ModuleDict({name: LMHead(cfg) for name in cfg.head_names})
        self.apply(self._init_weights)
        for layer in self.layers:  # GPT-2: residual projections scaled by 1/sqrt(2 x layers)
            for proj in (layer.attn_out, layer.ffn_out):
                nn.init.normal_(proj.weight, mean=0.0, std=cfg.init_std / (2 * cfg.layers) ** 0.5)
        self.tie_weights()
        self.affine = affine_map(cfg)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.cfg.init_std
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            nn.init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def tie_weights(self) -> None:
        """The one place where the heads' output projections are tied: to the token embeddings
        (``tie_embeddings``), else to the primary head's own matrix (one output projection for every head)."""
        shared = self.embeddings.tokens.weight if self.cfg.tie_embeddings else self.heads[PRIMARY].decoder.weight
        for head in self.heads.values():
            head.decoder.weight = shared

    @property
    def token_embeddings(self) -> nn.Embedding:
        return self.embeddings.tokens

    def hidden_states(self, input_ids: Tensor, depths: Sequence[int] | None = None,
                      padded: bool | None = None) -> dict[int, Tensor]:
        """Hidden states after each layer in ``depths`` (default: the last layer); layers above ``max(depths)`` are not
        computed; depth 0 is the embedding output. ``padded`` is accepted for the contract and not needed: batches
        are right-padded (module docstring)."""
        wanted = sorted(set(depths)) if depths is not None else [self.cfg.layers]
        if not wanted or wanted[0] < 0 or wanted[-1] > self.cfg.layers:
            raise ValueError(f"depths must lie in 0..{self.cfg.layers}, got {list(depths or [])}")
        x = self.embeddings(input_ids)  # (B, T, C)
        out: dict[int, Tensor] = {0: x} if wanted[0] == 0 else {}
        for i, layer in enumerate(self.layers[: wanted[-1]], start=1):
            x = layer(x)
            if i == self.cfg.affine_after and self.affine is not None:  # layer i's state is the mapped one
                x = self.affine(x)
            if i in wanted:
                out[i] = x
        return out

    def encode(self, input_ids: Tensor, padded: bool | None = None, layer: int = 0) -> Tensor:
        """Hidden states (B, T, C) after layer ``layer`` (0: the last; layers above it are not computed), through the
        primary head's final norm: at the last layer Hugging Face's ``last_hidden_state``, at a middle one the same
        norm over that layer's residual stream (pre-norm blocks leave it unnormalised). What a task head reads."""
        depth = layer or self.cfg.layers
        return self.final_state(self.hidden_states(input_ids, [depth], padded=padded)[depth])

    def final_state(self, h: Tensor) -> Tensor:
        """A layer's state ``h`` as ``encode`` gives it: after the primary head's final norm."""
        return self.heads[PRIMARY].norm(h)

    def logits(self, input_ids: Tensor, head: str = PRIMARY) -> Tensor:
        """Next-token logits of one head at every position (B, T, V)."""
        depth = self.cfg.head_depth(head)
        return self.heads[head](self.hidden_states(input_ids, [depth])[depth])

    mlm_logits = logits  # the contract's name (no masked positions here)

    def lm_losses(self, input_ids: Tensor, labels: Tensor, heads: Sequence[str] | None = None) -> dict[str, Tensor]:
        """Mean next-token cross-entropy of each head asked for; ``labels`` are the inputs shifted left by one
        (-100 at the last position: ``data.mlm`` makes them so), so position t is scored on token t+1."""
        return head_losses(self, input_ids, labels, heads)

    mlm_losses = lm_losses

    def num_parameters(self, trainable_only: bool = False) -> int:
        """Unique parameters (a tied projection counts once)."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

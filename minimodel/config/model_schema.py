"""The ``model:`` section of an experiment's configuration (``schema.ExperimentConfig.model``), apart so that the schema
stays readable. Like the schema, it imports nothing of minimodel."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

PRIMARY = "primary"  # the MLM head after the last layer; a secondary head after layer N is "l{N}"
ROPE_SCALINGS = ("none", "linear", "llama3")
LLAMA_OPTIONS = ("kv_heads", "head_size", "rope_scaling", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
                 "rope_original_max_positions", "qkv_bias", "qk_norm", "sliding_window")


@dataclass
class ModelConfig:
    vocab_size: int = 50_000
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    ffn: int = 3072
    max_positions: int = 514  # seq_len + 2: RoBERTa's positions start after the padding index
    dropout: float = 0.1
    attn_dropout: float = 0.1
    layer_norm_eps: float = 1e-5
    pad_id: int = 1
    mini_heads: list[int] = field(default_factory=list)  # depths of secondary MLM heads
    init_std: float = 0.02
    # the model family (minimodel/models/families.py): encoder (RoBERTa, masked LM) | decoder (causal LM). The options below
    # are the decoder's; the encoder takes their defaults only (checked at load time, ``families.check_model``)
    family: str = "encoder"
    norm: str = "layernorm"  # layernorm | rmsnorm (decoder)
    positions: str = "learned"  # learned | rotary (decoder)
    activation: str = "gelu"  # gelu | gelu_tanh (GPT-2) | swiglu (Llama: gated FFN of width ffn) (decoder)
    bias: bool = True  # biases in the linear layers and norms (decoder: GPT-2 true, Llama false)
    tie_embeddings: bool = True  # the LM heads project with the input embeddings (decoder: false = own matrix)
    rope_theta: float = 10_000.0  # rotary positions' base
    # the Llama family as shipped (Llama 3, Mistral, Qwen2, Qwen3, SmolLM2; decoder only, hf_decoder maps them):
    kv_heads: int = 0  # key/value heads; fewer than heads = grouped-query attention; 0 = heads
    head_size: int = 0  # the width of one attention head; 0 = hidden / heads (Qwen3 sets it apart from hidden)
    rope_scaling: str = "none"  # none | linear | llama3 (transformers' rope types of those names)
    rope_factor: float = 1.0  # linear, llama3: the factor that stretches the rotary wavelengths
    rope_low_freq_factor: float = 1.0  # llama3
    rope_high_freq_factor: float = 4.0  # llama3
    rope_original_max_positions: int = 8192  # llama3: the context length the model was first trained at
    qkv_bias: bool = False  # biases on the q, k, v projections only (Qwen2); model.bias gives every layer biases
    qk_norm: bool = False  # RMSNorm over each head's queries and keys, before rotary (Qwen3)
    sliding_window: int = 0  # attention window (Mistral); 0 = none; data.seq_len may not exceed it
    # an affine map of the residual stream (hidden -> hidden, with a bias) after this layer; 0 = none. MiniPost's
    # mini-model under bridge.init=affine: the map takes layer N's state to the state its copied top layers expect
    affine_after: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden", "layers", "heads", "ffn", "max_positions"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be a positive integer, got {getattr(self, name)}")
        if self.hidden % self.heads != 0 and self.head_size == 0:
            raise ValueError(f"model.hidden ({self.hidden}) must be divisible by model.heads ({self.heads}), "
                             f"or model.head_size set")
        self._check_llama_options()
        if self.positions == "rotary" and self.head_dim % 2:
            raise ValueError(f"model.positions=rotary needs an even head width (rotary turns pairs of features), got "
                             f"{self.head_dim} (model.hidden {self.hidden} / model.heads {self.heads}"
                             f"{f', model.head_size {self.head_size}' if self.head_size else ''})")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("layer_norm_eps", "init_std", "rope_theta"):
            if not 0.0 < getattr(self, name) < math.inf:
                raise ValueError(f"model.{name} must be a positive number, got {getattr(self, name)}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"model.pad_id ({self.pad_id}) must be a token id below vocab_size ({self.vocab_size})")
        depths = list(self.mini_heads)
        if len(set(depths)) != len(depths):
            raise ValueError(f"model.mini_heads has duplicates: {depths}")
        for depth in depths:
            if not 1 <= depth <= self.layers:
                raise ValueError(f"model.mini_heads: depth {depth} is outside 1..{self.layers} (model.layers)")
        self.mini_heads = sorted(depths)
        if not 0 <= self.affine_after < self.layers:
            raise ValueError(f"model.affine_after must be 0 (no affine map) or a layer in 1..{self.layers - 1} "
                             f"(below the last), got {self.affine_after}")

    def _check_llama_options(self) -> None:
        for name in ("kv_heads", "head_size", "sliding_window"):
            if getattr(self, name) < 0:
                raise ValueError(f"model.{name} must be 0 or a positive integer, got {getattr(self, name)}")
        if self.heads % self.key_value_heads != 0:
            raise ValueError(f"model.heads ({self.heads}) must be a multiple of model.kv_heads ({self.kv_heads}): "
                             f"each key/value head serves a group of query heads")
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ValueError(f"model.rope_scaling must be one of {', '.join(ROPE_SCALINGS)}, got {self.rope_scaling!r}")
        for name in ("rope_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
            if not 0.0 < getattr(self, name) < math.inf:
                raise ValueError(f"model.{name} must be a positive number, got {getattr(self, name)}")
        if self.rope_scaling == "llama3" and not self.rope_low_freq_factor < self.rope_high_freq_factor:
            raise ValueError(f"model.rope_low_freq_factor ({self.rope_low_freq_factor}) must be below "
                             f"model.rope_high_freq_factor ({self.rope_high_freq_factor}) (rope_scaling llama3)")
        if self.rope_original_max_positions <= 0:
            raise ValueError(f"model.rope_original_max_positions must be a positive integer, "
                             f"got {self.rope_original_max_positions}")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def key_value_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def attn_width(self) -> int:
        """The width of the queries (and of the attention output): heads x head_dim (= hidden unless head_size)."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """The width of the keys, and of the values: key_value_heads x head_dim."""
        return self.key_value_heads * self.head_dim

    @property
    def layer_linear(self) -> int:
        """The weights of one transformer layer's matrices: q, k, v (h x (attn_width + 2 kv_width): smaller under
        grouped-query attention), the attention output, the FFN's input map (a gate and an up projection with
        SwiGLU) and its output map. 12 h^2 for the paper's layer (4 h^2 attention, a 4h FFN)."""
        ffn_in = (2 if self.activation == "swiglu" else 1) * self.ffn
        return (self.hidden * (self.attn_width + 2 * self.kv_width) + self.attn_width * self.hidden
                + self.hidden * ffn_in + self.ffn * self.hidden)

    def llama_options(self) -> dict[str, Any]:
        """The options of the Llama family as shipped that differ from their defaults (an encoder takes none)."""
        defaults = ModelConfig.__dataclass_fields__
        return {k: getattr(self, k) for k in LLAMA_OPTIONS if getattr(self, k) != defaults[k].default}

    @property
    def head_names(self) -> list[str]:
        return [PRIMARY] + [f"l{d}" for d in self.mini_heads]

    def head_depth(self, name: str) -> int:
        if name == PRIMARY:
            return self.layers
        if name.startswith("l") and name[1:].isdigit() and int(name[1:]) in self.mini_heads:
            return int(name[1:])
        raise KeyError(f"no MLM head {name!r}; this model has {self.head_names}")

    def to_dict(self) -> dict:
        return asdict(self)

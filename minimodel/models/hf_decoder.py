"""Conversion between ``DecoderLM`` (``model.family: decoder``) and Hugging Face ``GPT2LMHeadModel`` /
``LlamaForCausalLM``; the decoder family's ``hf`` module (``families.hf_module``).

Needs ``transformers`` (``pip install minimodel[hf]``); it is imported only inside the functions. ``from_hf`` reads a
local directory, a hub id or a GGUF file through the one door for outside models (``outside``), as ``hf.from_hf`` does
for RoBERTa (safetensors first; a pickled ``pytorch_model.bin`` only as plain data; sizes checked before anything is
built; every failure the project's error naming the file).

GPT-2 (``model_type: gpt2``) -> ``norm: layernorm, positions: learned, activation: gelu_tanh`` (``gelu_new``;
``gelu`` too), biases, tied embeddings. Weights (``T.`` = ``transformer.``, ``H.`` = ``T.h.{i}.``; GPT-2's ``Conv1D``
stores (in, out), so every matrix is transposed)::

    T.wte / T.wpe                      -> embeddings.tokens / embeddings.positions
    H.ln_1 / H.ln_2                    -> layers.{i}.attn_norm / ffn_norm
    H.attn.c_attn / H.attn.c_proj      -> layers.{i}.qkv / attn_out
    H.mlp.c_fc / H.mlp.c_proj          -> layers.{i}.ffn_in / ffn_out
    T.ln_f                             -> heads.primary.norm
    lm_head                            -> tied to embeddings.tokens

The Llama family (``model_type`` llama, mistral, qwen2, qwen3) -> ``norm: rmsnorm, positions: rotary, activation:
swiglu, bias: false``, tied or untied (``tie_word_embeddings``), with what each type ships: grouped-query attention
(``kv_heads``), a free head width (``head_size``), rope theta and the scalings linear / llama3, q/k/v biases (qwen2:
``qkv_bias``), per-head q/k RMSNorm (qwen3: ``qk_norm``), a sliding window (``sliding_window``); no MLP biases
(``M.`` = ``model.layers.{i}.``)::

    model.embed_tokens                 -> embeddings.tokens
    M.input_layernorm / M.post_attention_layernorm -> layers.{i}.attn_norm / ffn_norm
    M.self_attn.{q,k,v}_proj           -> layers.{i}.qkv (concatenated)
    M.self_attn.o_proj                 -> layers.{i}.attn_out
    M.mlp.{gate,up}_proj / M.mlp.down_proj -> layers.{i}.ffn_in ([gate; up]) / ffn_out
    model.norm                         -> heads.primary.norm
    lm_head                            -> heads.primary.decoder (untied), or tied to embeddings.tokens

An export with a new tokenizer (``minimodel export``: the target language's SentencePiece model) is written as the
source's type, except where transformers' ``AutoTokenizer`` would not load that tokenizer: for ``qwen2`` it builds
Qwen2's own byte-level BPE whatever the directory declares (transformers 5), which cannot hold a SentencePiece
vocabulary, so a Qwen2 model is written as ``llama`` with ``attention_bias`` (its q/k/v biases, and an output-projection
bias of zeros): the same function, and a tokenizer that loads as written (``export_type``).

Padding: neither model has a padding token; ``pad_id`` is ``pad_token_id`` where the config sets one, else the
end-of-sequence id (the tokenizer side does the same: ``HFTokenizer(causal=True)``). Secondary heads are not exported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from minimodel.config.schema import PRIMARY, ModelConfig
from minimodel.errors import CheckpointError, ConfigError
from minimodel.log import get_logger
from minimodel.models import gguf_copy, outside
from minimodel.models.decoder import DecoderLM
from minimodel.models.decoder_task import task_to_hf  # noqa: F401  (minimodel export task=T: the family's task export)
from minimodel.models.gguf import gguf_summary

log = get_logger(__name__)
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def _first(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pad(hf_config: Any, vocab: int, source: str) -> int:
    """``pad_token_id``, else the (first) end-of-sequence id, else 0: a token id below ``vocab``."""
    pad = _first(getattr(hf_config, "pad_token_id", None))
    name = "pad_token_id"
    if pad is None:
        pad, name = _first(getattr(hf_config, "eos_token_id", None)), "eos_token_id"
    if pad is None:
        return 0
    if not 0 <= pad < vocab:
        raise ConfigError(f"{source}: {name}={pad!r} is not a token id below vocab_size={vocab} (minimodel pads "
                          f"with it)")
    return pad


LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MODEL_TYPES = ("gpt2", *LLAMA_TYPES)  # what the family reads (outside.GGUF_ARCHITECTURES: the same, from a GGUF file)
"""The ``model_type`` values of the Llama family: one architecture (RMSNorm, rotary, SwiGLU, no biases) with
grouped-query attention and a free head width, plus q/k/v biases (qwen2), per-head q/k RMSNorm (qwen3) and a sliding
attention window (mistral; qwen2/3 where ``use_sliding_window``)."""
ROPE_TYPES = {"default": "none", "linear": "linear", "llama3": "llama3"}  # transformers' rope_type -> model.rope_scaling


def _rope(hf_config: Any) -> dict[str, Any]:
    """transformers' rope settings: ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (4)."""
    params = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10_000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default")) or "default"
    return params


class _Fields:
    """A dict's items as attributes (the rope settings, for ``outside.size``)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


def _window(hf_config: Any, kind: str, source: str) -> int:
    """The sliding attention window of any layer (0: none)."""
    window = getattr(hf_config, "sliding_window", None)
    if kind in ("qwen2", "qwen3"):
        sliding = "sliding_attention" in (getattr(hf_config, "layer_types", None) or [])
        window = window if sliding or getattr(hf_config, "use_sliding_window", False) else None
    return 0 if window is None else outside.size(hf_config, "sliding_window", source, low=0)


def _llama_like(hf_config: Any, kind: str, refuse: Any, source: str) -> ModelConfig:
    size = lambda name, default=None: outside.size(hf_config, name, source, default)  # noqa: E731
    heads, hidden, vocab = size("num_attention_heads"), size("hidden_size"), size("vocab_size")
    rope = _rope(hf_config)
    checks = [("hidden_act", hf_config.hidden_act, ("silu",)), ("mlp_bias", bool(getattr(hf_config, "mlp_bias", False)), (False,)),
              ("rope_type", rope["rope_type"], tuple(ROPE_TYPES))]
    partial = rope.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", None))
    if partial is not None:  # transformers rotates that share of each head's features (Phi's, StableLM's): ours all
        checks.append(("partial_rotary_factor", partial, (1, 1.0)))
    if kind == "qwen3":  # Qwen3's attention_bias biases q, k, v and the output projection: the family has q/k/v only
        checks.append(("attention_bias", bool(getattr(hf_config, "attention_bias", False)), (False,)))
    for name, value, allowed in checks:
        if value not in allowed:
            raise refuse(name, value, f"in {list(allowed)}")
    if hidden % heads and getattr(hf_config, "head_dim", None) is None:
        raise ConfigError(f"{source}: num_attention_heads={heads} does not divide hidden_size={hidden}, and no "
                          f"head_dim is set")
    head_dim = size("head_dim", hidden // heads)

    def rope_number(name: str, default: float) -> float:
        value = rope.get(name)
        return default if value is None else outside.number(value, f"rope_scaling.{name}", source)

    kv_heads = size("num_key_value_heads", heads)
    if heads % kv_heads:
        raise ConfigError(f"{source}: num_key_value_heads={kv_heads} does not divide num_attention_heads={heads} "
                          f"(each key/value head serves a group of query heads)")
    return ModelConfig(
        family="decoder", norm="rmsnorm", positions="rotary", activation="swiglu", bias=False,
        tie_embeddings=bool(hf_config.tie_word_embeddings), vocab_size=vocab, hidden=hidden,
        layers=size("num_hidden_layers"), heads=heads, ffn=size("intermediate_size"),
        max_positions=size("max_position_embeddings"), dropout=0.0,
        attn_dropout=outside.field_number(hf_config, "attention_dropout", source, 0.0, fraction=True),
        layer_norm_eps=outside.field_number(hf_config, "rms_norm_eps", source), pad_id=_pad(hf_config, vocab, source),
        init_std=outside.field_number(hf_config, "initializer_range", source),
        rope_theta=outside.number(rope["rope_theta"], "rope_theta", source),
        kv_heads=0 if kv_heads == heads else kv_heads,
        head_size=0 if head_dim * heads == hidden else head_dim, rope_scaling=ROPE_TYPES[rope["rope_type"]],
        rope_factor=rope_number("factor", 1.0), rope_low_freq_factor=rope_number("low_freq_factor", 1.0),
        rope_high_freq_factor=rope_number("high_freq_factor", 4.0),
        rope_original_max_positions=outside.size(_Fields(rope), "original_max_position_embeddings",
                                                 f"{source} (rope_scaling)", 8192),
        qkv_bias=kind == "qwen2" or (kind == "llama" and bool(getattr(hf_config, "attention_bias", False))),
        qk_norm=kind == "qwen3", sliding_window=_window(hf_config, kind, source))


def hf_type(cfg: ModelConfig) -> str:
    """The transformers ``model_type`` a Llama-family config exports to: qwen3 (q/k norm), qwen2 (q/k/v biases),
    mistral (a sliding window), else llama (which covers grouped-query attention, head width and rope scaling)."""
    return "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "mistral" if cfg.sliding_window else "llama"


def hf_config_to_model_config(hf_config: Any, source: str = "hf config") -> ModelConfig:
    """Our ``ModelConfig`` (family decoder) of a ``GPT2Config`` or ``LlamaConfig``; a ``ConfigError`` naming ``source``
    and the field for anything else."""
    kind = getattr(hf_config, "model_type", None)

    def refuse(name: str, value: object, allowed: object) -> ConfigError:
        return ConfigError(f"{source}: unsupported {name}={value!r} (minimodel supports {name} {allowed})")

    if kind == "gpt2":
        act = hf_config.activation_function
        if act not in GPT2_ACTIVATIONS:
            raise refuse("activation_function", act, f"in {sorted(GPT2_ACTIVATIONS)}")
        for name in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
            if getattr(hf_config, name, False):
                raise refuse(name, True, "= false")
        if not getattr(hf_config, "scale_attn_weights", True):
            raise refuse("scale_attn_weights", False, "= true")
        if not getattr(hf_config, "tie_word_embeddings", True):  # GPT-2's output projection is its token embeddings
            raise refuse("tie_word_embeddings", False, "= true for gpt2")
        size = lambda name, default=None: outside.size(hf_config, name, source, default)  # noqa: E731
        hidden, heads, vocab = size("n_embd"), size("n_head"), size("vocab_size")
        if hidden % heads:
            raise ConfigError(f"{source}: n_head={heads} does not divide n_embd={hidden} (each head takes an equal "
                              f"share of the width)")
        return ModelConfig(
            family="decoder", norm="layernorm", positions="learned", activation=GPT2_ACTIVATIONS[act], bias=True,
            tie_embeddings=True, vocab_size=vocab, hidden=hidden, layers=size("n_layer"), heads=heads,
            ffn=size("n_inner", 4 * hidden), max_positions=size("n_positions"),
            dropout=outside.field_number(hf_config, "resid_pdrop", source, fraction=True),
            attn_dropout=outside.field_number(hf_config, "attn_pdrop", source, fraction=True),
            layer_norm_eps=outside.field_number(hf_config, "layer_norm_epsilon", source),
            pad_id=_pad(hf_config, vocab, source), init_std=outside.field_number(hf_config, "initializer_range", source))
    if kind in LLAMA_TYPES:
        return _llama_like(hf_config, kind, refuse, source)
    raise refuse("model_type", kind, f"in {list(MODEL_TYPES)} for model.family=decoder")


def _gpt2_map(cfg: ModelConfig) -> dict[str, tuple[str, bool]]:
    """Our parameter -> (GPT-2's, transposed)."""
    m = {"embeddings.tokens.weight": ("transformer.wte.weight", False),
         "embeddings.positions.weight": ("transformer.wpe.weight", False),
         f"heads.{PRIMARY}.norm.weight": ("transformer.ln_f.weight", False),
         f"heads.{PRIMARY}.norm.bias": ("transformer.ln_f.bias", False)}
    for i in range(cfg.layers):
        h = f"transformer.h.{i}."
        for ours, theirs in (("attn_norm", "ln_1"), ("ffn_norm", "ln_2")):
            for p in ("weight", "bias"):
                m[f"layers.{i}.{ours}.{p}"] = (f"{h}{theirs}.{p}", False)
        for ours, theirs in (("qkv", "attn.c_attn"), ("attn_out", "attn.c_proj"), ("ffn_in", "mlp.c_fc"),
                             ("ffn_out", "mlp.c_proj")):
            m[f"layers.{i}.{ours}.weight"] = (f"{h}{theirs}.weight", True)
            m[f"layers.{i}.{ours}.bias"] = (f"{h}{theirs}.bias", False)
    return m


def _llama_map(cfg: ModelConfig) -> dict[str, list[str]]:
    """Our parameter -> the Llama family's (several: concatenated on the output dimension, ``_llama_split``)."""
    m = {"embeddings.tokens.weight": ["model.embed_tokens.weight"], f"heads.{PRIMARY}.norm.weight": ["model.norm.weight"]}
    if not cfg.tie_embeddings:
        m[f"heads.{PRIMARY}.decoder.weight"] = ["lm_head.weight"]
    for i in range(cfg.layers):
        h = f"model.layers.{i}."
        m[f"layers.{i}.attn_norm.weight"] = [h + "input_layernorm.weight"]
        m[f"layers.{i}.ffn_norm.weight"] = [h + "post_attention_layernorm.weight"]
        m[f"layers.{i}.qkv.weight"] = [f"{h}self_attn.{n}_proj.weight" for n in "qkv"]
        if cfg.qkv_bias:
            m[f"layers.{i}.qkv.bias"] = [f"{h}self_attn.{n}_proj.bias" for n in "qkv"]
        if cfg.qk_norm:
            m[f"layers.{i}.q_norm.weight"] = [h + "self_attn.q_norm.weight"]
            m[f"layers.{i}.k_norm.weight"] = [h + "self_attn.k_norm.weight"]
        m[f"layers.{i}.attn_out.weight"] = [h + "self_attn.o_proj.weight"]
        m[f"layers.{i}.ffn_in.weight"] = [h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"]
        m[f"layers.{i}.ffn_out.weight"] = [h + "mlp.down_proj.weight"]
    return m


def _llama_split(cfg: ModelConfig, n: int) -> list[int]:
    """The widths of the ``n`` parts one of our tensors concatenates: q, k, v (the query width, then two key/value
    widths), or gate and up (ffn each)."""
    return [cfg.attn_width, cfg.kv_width, cfg.kv_width] if n == 3 else [cfg.ffn] * n


def _is_gpt2(cfg: ModelConfig) -> bool:
    return cfg.positions == "learned"


def hf_state_dict_to_ours(hf_sd: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    get = lambda key: hf_sd[key].detach().to(torch.float32)  # noqa: E731
    if _is_gpt2(cfg):
        ours = {mine: get(theirs).t().contiguous() if t else get(theirs) for mine, (theirs, t) in _gpt2_map(cfg).items()}
    else:
        ours = {mine: torch.cat([get(k) for k in theirs], dim=0) for mine, theirs in _llama_map(cfg).items()}
        # Llama's attention_bias (what a Qwen2 export is written as) biases the output projection too: ours has none
        o_bias = [k for k in hf_sd if k.endswith("self_attn.o_proj.bias") and bool(hf_sd[k].detach().any())]
        if o_bias:
            raise CheckpointError(f"attention_bias with a non-zero output-projection bias ({o_bias[0]}, ...): the decoder "
                             f"family has q/k/v biases only (Qwen2's); a Llama written by minimodel export has zeros")
    if cfg.tie_embeddings:
        ours[f"heads.{PRIMARY}.decoder.weight"] = ours["embeddings.tokens.weight"]
    return ours


def our_state_dict_to_hf(model: DecoderLM) -> dict[str, Tensor]:
    cfg, sd = model.cfg, {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if _is_gpt2(cfg):
        hf = {theirs: sd[mine].t().contiguous() if t else sd[mine] for mine, (theirs, t) in _gpt2_map(cfg).items()}
    else:
        hf = {}
        for mine, theirs in _llama_map(cfg).items():
            parts = [sd[mine]] if len(theirs) == 1 else sd[mine].split(_llama_split(cfg, len(theirs)), dim=0)
            hf.update(zip(theirs, (p.contiguous() for p in parts)))
    if cfg.tie_embeddings:
        hf["lm_head.weight"] = sd["embeddings.tokens.weight"]
    return hf


def from_hf(path: str | Path, lengths: dict[str, int] | None = None, runs_dir: str | Path = "") -> DecoderLM:
    """Load a Hugging Face causal LM of the decoder family (``GPT2LMHeadModel``, or a Llama-family model: Llama,
    Mistral, Qwen2, Qwen3; a local directory, a hub id, or a GGUF file / a directory holding one, dequantised to
    float32 on load) as ``DecoderLM``; its logits match the HF model's (eval mode) up to float rounding. Read through
    the one door for outside models (``outside``): every failure is the project's error naming the file; sizes are
    checked before anything is built, and ``lengths`` (``families.sequence_lengths``) against the source's positions
    and sliding window. ``runs_dir`` (the experiment's): a GGUF file is read from its copy converted once there
    (``outside.gguf_copy``), not dequantised again on every load."""
    tf = outside.transformers()
    src = gguf_copy.local_source(outside.source(path), runs_dir, MODEL_TYPES, "decoder")
    hf_config = outside.read_config(src, MODEL_TYPES, "decoder")
    cfg = outside.model_config(hf_config_to_model_config, hf_config, src)
    outside.check_memory(cfg, src)
    outside.check_lengths(cfg, lengths or {}, src,
                          "n_positions" if hf_config.model_type == "gpt2" else "max_position_embeddings")
    if src.gguf is not None:
        log.info(f"{src.name}: {gguf_summary(src.where, src.gguf.name)}; dequantised to float32")
    hf_model, info = outside.load_weights(tf.AutoModelForCausalLM, src, hf_config,
                                          build=tf.AutoModelForCausalLM.from_config, dtype=torch.float32)
    outside.missing_weights(info, src, {"lm_head.weight"} if cfg.tie_embeddings else set(), "*ForCausalLM")
    model = DecoderLM(cfg)
    model.load_state_dict(outside.convert(src, lambda: hf_state_dict_to_ours(hf_model.state_dict(), cfg)),
                          strict=True)
    model.tie_weights()
    return model.eval()


def _rope_scaling(cfg: ModelConfig) -> dict[str, Any] | None:
    if cfg.rope_scaling == "none":
        return None
    scaling: dict[str, Any] = {"rope_type": cfg.rope_scaling, "factor": cfg.rope_factor}
    if cfg.rope_scaling == "llama3":
        scaling.update(low_freq_factor=cfg.rope_low_freq_factor, high_freq_factor=cfg.rope_high_freq_factor,
                       original_max_position_embeddings=cfg.rope_original_max_positions)
    return scaling


def _window_options(kind: str, window: int) -> dict[str, Any]:
    """A sliding window in transformers' terms: Mistral's ``sliding_window``; Qwen's ``use_sliding_window`` on every
    layer (``max_window_layers`` 0: the sequences minimodel runs fit the window, so which layers slide is moot)."""
    if kind == "mistral":
        return {"sliding_window": window or None}
    if kind in ("qwen2", "qwen3"):
        return {"use_sliding_window": True, "sliding_window": window, "max_window_layers": 0} if window else \
            {"use_sliding_window": False}
    return {}


def _tokenizer_bound(kind: str) -> bool:
    """Whether transformers' ``AutoTokenizer`` ignores the tokenizer class a ``kind`` directory declares and builds the
    type's own (its list of model types whose hub tokenizer classes it distrusts; qwen2 in transformers 5)."""
    try:
        from transformers.models.auto import tokenization_auto
    except ImportError:  # pragma: no cover - transformers is checked by _transformers()
        return False
    return kind in getattr(tokenization_auto, "MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS", ())


def export_type(cfg: ModelConfig, new_tokenizer: bool) -> str:
    """The ``model_type`` ``to_hf`` writes a Llama-family ``cfg`` as: ``hf_type``, or with a ``new_tokenizer`` beside it
    and a type whose tokenizer transformers replaces (``_tokenizer_bound``), ``llama`` where Llama can express the
    model exactly (q/k/v biases through ``attention_bias``, no q/k norm, no sliding window); ``ConfigError``
    otherwise."""
    kind = hf_type(cfg)
    if not (new_tokenizer and _tokenizer_bound(kind)):
        return kind
    if cfg.qk_norm or cfg.sliding_window:
        raise ConfigError(f"a {kind} model with a new tokenizer cannot be exported: transformers' AutoTokenizer "
                          f"replaces any tokenizer beside a {kind} config with {kind}'s own, and Llama cannot hold "
                          f"model.qk_norm={cfg.qk_norm}, model.sliding_window={cfg.sliding_window}; export the "
                          f"embeddings alone (--embeddings-only)")
    log.info(f"export: written as model_type llama (attention_bias, output-projection bias 0), not {kind}: "
             f"transformers' AutoTokenizer would replace the new tokenizer beside a {kind} config with {kind}'s own")
    return "llama"


def hf_config(cfg: ModelConfig, bos: int, eos: int, pad: int, kind: str | None = None) -> Any:
    """The transformers config of ``cfg`` (``GPT2Config``, or ``LlamaConfig`` / ``MistralConfig`` / ``Qwen2Config`` /
    ``Qwen3Config`` by ``kind``, by default ``hf_type``); ``ConfigError`` (naming the ``model.*`` keys) for options
    none of them has."""
    tf = outside.transformers()
    if cfg.positions == "learned" and cfg.norm == "layernorm" and cfg.bias and cfg.tie_embeddings and \
            cfg.activation in ("gelu_tanh", "gelu") and not cfg.llama_options():
        return tf.GPT2Config(
            vocab_size=cfg.vocab_size, n_embd=cfg.hidden, n_layer=cfg.layers, n_head=cfg.heads, n_inner=cfg.ffn,
            n_positions=cfg.max_positions, resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.attn_dropout, layer_norm_epsilon=cfg.layer_norm_eps, initializer_range=cfg.init_std,
            activation_function="gelu_new" if cfg.activation == "gelu_tanh" else "gelu", bos_token_id=bos,
            eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=True)
    if cfg.positions == "rotary" and cfg.norm == "rmsnorm" and not cfg.bias and cfg.activation == "swiglu":
        kind = kind or hf_type(cfg)
        cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config,
               "qwen3": tf.Qwen3Config}[kind]
        extra: dict[str, Any] = {"attention_bias": cfg.qkv_bias} if kind in ("llama", "qwen3") else {}
        return cls(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
            num_attention_heads=cfg.heads, num_key_value_heads=cfg.key_value_heads, head_dim=cfg.head_dim,
            intermediate_size=cfg.ffn, max_position_embeddings=cfg.max_positions, rms_norm_eps=cfg.layer_norm_eps,
            initializer_range=cfg.init_std, hidden_act="silu", attention_dropout=cfg.attn_dropout,
            rope_theta=cfg.rope_theta, rope_scaling=_rope_scaling(cfg), bos_token_id=bos, eos_token_id=eos,
            pad_token_id=pad, tie_word_embeddings=cfg.tie_embeddings, **extra,
            **_window_options(kind, cfg.sliding_window))
    raise ConfigError(f"a decoder with model.norm={cfg.norm}, model.positions={cfg.positions}, model.activation="
                      f"{cfg.activation}, model.bias={cfg.bias}, model.tie_embeddings={cfg.tie_embeddings} is neither "
                      f"GPT-2 (layernorm, learned, gelu_tanh or gelu, biases, tied) nor of the Llama family (rmsnorm, "
                      f"rotary, swiglu, no biases): no transformers class holds it, so it cannot be exported as a "
                      f"transformers model; export the embeddings alone (--embeddings-only)")


def to_hf(model: DecoderLM, path: str | Path, bos: int = 0, eos: int = 2, pad: int = 1,
          new_tokenizer: bool = True) -> None:
    """Save ``model`` (its primary head) as a HF ``GPT2LMHeadModel`` or Llama-family ``*ForCausalLM`` directory,
    which ``AutoModelForCausalLM`` loads; ``bos`` / ``eos`` / ``pad``: the ids of the tokenizer shipped with it (by
    default a SentencePiece model's <s> 0, </s> 2, <pad> 1: what ``minimodel export`` writes, whatever the source
    model's tokenizer padded with); ``new_tokenizer``: a tokenizer other than the type's own goes beside it (the
    written type: ``export_type``)."""
    tf = outside.transformers()
    kind = None if _is_gpt2(model.cfg) else export_type(model.cfg, new_tokenizer)
    config = hf_config(model.cfg, bos, eos, pad, kind)
    hf_model = tf.AutoModelForCausalLM.from_config(config)
    weights = our_state_dict_to_hf(model)
    if kind == "llama" and model.cfg.qkv_bias:  # Llama's attention_bias also gives the output projection one: 0
        weights.update({k.replace(".weight", ".bias"): torch.zeros(v.shape[0], dtype=v.dtype)
                        for k, v in weights.items() if k.endswith("self_attn.o_proj.weight")})
    missing, unexpected = hf_model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if missing or unexpected:
        raise ValueError(f"weights do not map onto {type(hf_model).__name__}: missing {missing}, unexpected {unexpected}")
    if model.cfg.tie_embeddings:
        hf_model.tie_weights()
    Path(path).mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(str(path))

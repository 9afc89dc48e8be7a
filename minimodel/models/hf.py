"""Conversion between ``RobertaMLM`` and Hugging Face ``RobertaForMaskedLM`` / ``XLMRobertaForMaskedLM``.

Needs ``transformers`` (``pip install minimodel[hf]``); it is imported only inside the functions.

Config (HF -> ours): vocab_size, hidden_size -> hidden, num_hidden_layers -> layers,
num_attention_heads -> heads, intermediate_size -> ffn, max_position_embeddings -> max_positions,
hidden_dropout_prob -> dropout, attention_probs_dropout_prob -> attn_dropout, layer_norm_eps,
pad_token_id -> pad_id, initializer_range -> init_std. Only ``model_type`` roberta / xlm-roberta with
``hidden_act="gelu"`` and absolute positions, as an encoder (no decoder / cross-attention), is accepted.

Weights (HF ``roberta.`` prefix dropped; ``L.`` = ``encoder.layer.{i}.`` -> ``layers.{i}.``)::

    embeddings.word_embeddings             -> embeddings.tokens
    embeddings.position_embeddings         -> embeddings.positions  (+ token_type_embeddings[0], see below)
    embeddings.LayerNorm                   -> embeddings.norm
    L.attention.self.{query,key,value}     -> layers.{i}.qkv        (concatenated q, k, v on the output dim)
    L.attention.output.dense               -> layers.{i}.attn_out
    L.attention.output.LayerNorm           -> layers.{i}.attn_norm
    L.intermediate.dense                   -> layers.{i}.ffn_in
    L.output.dense                         -> layers.{i}.ffn_out
    L.output.LayerNorm                     -> layers.{i}.ffn_norm
    lm_head.{dense,layer_norm,bias}        -> heads.primary.{dense,norm,bias}
    lm_head.decoder.weight                 -> tied to embeddings.tokens (must equal the word embeddings)

Our model has no token-type embeddings. RoBERTa feeds type id 0 at every position (pad included),
so HF adds ``token_type_embeddings.weight[0]`` to every token; adding that row to every row of our
position table gives the same sum, hence the same outputs. ``to_hf`` writes a zero token-type table
(``type_vocab_size=1``), so ``from_hf(to_hf(m))`` returns ``m``'s parameters bit for bit.

Only the primary head is exported as ``lm_head``: secondary mini heads (``l4`` ...) have no place in
a HF ``*ForMaskedLM`` and are skipped by ``to_hf``; ``from_hf`` returns a model without mini heads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from minimodel.errors import CheckpointError, ConfigError
from minimodel.models import gguf_copy, outside
from minimodel.models.model import PRIMARY, ModelConfig, RobertaMLM

SUPPORTED_MODEL_TYPES = ("roberta", "xlm-roberta")


def _check_supported(hf_config: Any, source: str) -> None:
    """Raise ``ConfigError`` naming ``source`` and the field when ``hf_config`` is not a plain RoBERTa encoder."""
    position = getattr(hf_config, "position_embedding_type", None) or "absolute"  # gone from the config in v5
    checks: list[tuple[str, object, tuple[object, ...]]] = [
        ("model_type", getattr(hf_config, "model_type", None), SUPPORTED_MODEL_TYPES),
        ("hidden_act", getattr(hf_config, "hidden_act", None), ("gelu",)),
        ("position_embedding_type", position, ("absolute",)),
        ("is_decoder", bool(getattr(hf_config, "is_decoder", False)), (False,)),
        ("add_cross_attention", bool(getattr(hf_config, "add_cross_attention", False)), (False,)),
    ]
    for name, value, allowed in checks:
        if value not in allowed:
            raise ConfigError(f"{source}: unsupported {name}={value!r} (minimodel supports {name} in {list(allowed)})")
    if getattr(hf_config, "pad_token_id", None) is None:
        raise ConfigError(f"{source}: unsupported pad_token_id=None (RoBERTa positions need a padding index)")
    outside.size(hf_config, "type_vocab_size", source, default=1)


def _sizes(hf_config: Any, source: str) -> dict[str, int]:
    """The sizes of a RoBERTa config, each an integer in range (``outside.size``), heads dividing the width."""
    sizes = {ours: outside.size(hf_config, theirs, source) for ours, theirs in (
        ("vocab_size", "vocab_size"), ("hidden", "hidden_size"), ("layers", "num_hidden_layers"),
        ("heads", "num_attention_heads"), ("ffn", "intermediate_size"), ("max_positions", "max_position_embeddings"))}
    if sizes["hidden"] % sizes["heads"]:
        raise ConfigError(f"{source}: num_attention_heads={sizes['heads']} does not divide hidden_size="
                          f"{sizes['hidden']} (each head takes an equal share of the width)")
    pad = getattr(hf_config, "pad_token_id", None)
    if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < sizes["vocab_size"]:
        raise ConfigError(f"{source}: pad_token_id={pad!r} is not a token id below vocab_size={sizes['vocab_size']}")
    return sizes


def hf_config_to_model_config(hf_config: Any, source: str = "hf config") -> ModelConfig:
    """Our ``ModelConfig`` for a HF ``RobertaConfig`` / ``XLMRobertaConfig`` (``ConfigError`` naming the field if
    unsupported)."""
    _check_supported(hf_config, source)
    return ModelConfig(
        **_sizes(hf_config, source),
        dropout=outside.field_number(hf_config, "hidden_dropout_prob", source, fraction=True),
        attn_dropout=outside.field_number(hf_config, "attention_probs_dropout_prob", source, fraction=True),
        layer_norm_eps=outside.field_number(hf_config, "layer_norm_eps", source),
        pad_id=int(hf_config.pad_token_id),
        init_std=outside.field_number(hf_config, "initializer_range", source, 0.02),
    )


def _layer_map(i: int) -> dict[str, str]:
    """Our layer-``i`` module prefix -> HF module prefix (``qkv`` is handled apart)."""
    hf = f"encoder.layer.{i}."
    return {
        f"layers.{i}.attn_out": hf + "attention.output.dense",
        f"layers.{i}.attn_norm": hf + "attention.output.LayerNorm",
        f"layers.{i}.ffn_in": hf + "intermediate.dense",
        f"layers.{i}.ffn_out": hf + "output.dense",
        f"layers.{i}.ffn_norm": hf + "output.LayerNorm",
    }


def _module_map(cfg: ModelConfig) -> dict[str, str]:
    """Our module prefix -> HF module prefix, for the modules copied one to one (weight and bias)."""
    m = {"embeddings.norm": "roberta.embeddings.LayerNorm",
         f"heads.{PRIMARY}.dense": "lm_head.dense", f"heads.{PRIMARY}.norm": "lm_head.layer_norm"}
    for i in range(cfg.layers):
        m.update({ours: "roberta." + hf for ours, hf in _layer_map(i).items()})
    return m


def _qkv(i: int) -> list[str]:
    return [f"roberta.encoder.layer.{i}.attention.self.{n}" for n in ("query", "key", "value")]


def hf_state_dict_to_ours(hf_sd: dict[str, Tensor], cfg: ModelConfig, source: str = "hf model") -> dict[str, Tensor]:
    """Map a HF ``*ForMaskedLM`` state dict onto ``RobertaMLM(cfg).state_dict()`` keys (token types folded)."""
    get = lambda key: hf_sd[key].detach().to(torch.float32)  # noqa: E731
    words = get("roberta.embeddings.word_embeddings.weight")
    decoder = hf_sd.get("lm_head.decoder.weight")
    if decoder is not None and not torch.equal(decoder.detach().to(torch.float32), words):
        raise CheckpointError(f"{source}: lm_head.decoder.weight differs from the word embeddings (tie_word_embeddings="
                              f"false?); minimodel ties them")
    token_type0 = get("roberta.embeddings.token_type_embeddings.weight")[0]
    ours: dict[str, Tensor] = {
        "embeddings.tokens.weight": words,
        "embeddings.positions.weight": get("roberta.embeddings.position_embeddings.weight") + token_type0,
        f"heads.{PRIMARY}.decoder.weight": words,
        f"heads.{PRIMARY}.bias": get("lm_head.bias"),
    }
    for mine, theirs in _module_map(cfg).items():
        for p in ("weight", "bias"):
            ours[f"{mine}.{p}"] = get(f"{theirs}.{p}")
    for i in range(cfg.layers):
        for p in ("weight", "bias"):
            ours[f"layers.{i}.qkv.{p}"] = torch.cat([get(f"{m}.{p}") for m in _qkv(i)], dim=0)
    return ours


def our_state_dict_to_hf(model: RobertaMLM) -> dict[str, Tensor]:
    """The HF ``*ForMaskedLM`` state dict of ``model``'s encoder and primary head (zero token types)."""
    cfg, sd = model.cfg, {k: v.detach().cpu() for k, v in model.state_dict().items()}
    words = sd["embeddings.tokens.weight"]
    hf: dict[str, Tensor] = {
        "roberta.embeddings.word_embeddings.weight": words,
        "roberta.embeddings.position_embeddings.weight": sd["embeddings.positions.weight"],
        "roberta.embeddings.token_type_embeddings.weight": torch.zeros(1, cfg.hidden, dtype=words.dtype),
        "lm_head.decoder.weight": words,
        "lm_head.bias": sd[f"heads.{PRIMARY}.bias"],
        "lm_head.decoder.bias": sd[f"heads.{PRIMARY}.bias"],
    }
    for mine, theirs in _module_map(cfg).items():
        for p in ("weight", "bias"):
            hf[f"{theirs}.{p}"] = sd[f"{mine}.{p}"]
    for i in range(cfg.layers):
        for p in ("weight", "bias"):
            for name, part in zip(_qkv(i), sd[f"layers.{i}.qkv.{p}"].chunk(3, dim=0)):
                hf[f"{name}.{p}"] = part
    return hf


def from_hf(path: str | Path, lengths: dict[str, int] | None = None, runs_dir: str | Path = "") -> RobertaMLM:
    """Load a HF ``RobertaForMaskedLM`` / ``XLMRobertaForMaskedLM`` (local directory or hub id) as ``RobertaMLM``.

    Outputs match HF's (eval mode, ``token_type_ids`` left at 0) up to float rounding. Read through the one door for
    outside models (``outside``): an unreadable source is a ``CheckpointError``, an unsupported config a
    ``ConfigError`` naming the field, a model that would not fit the memory available a ``ConfigError`` with the
    figures, before anything is built; ``lengths`` (``families.sequence_lengths``): the sequences it will run,
    checked against its positions. The weights are ``model.safetensors`` whenever the directory has it; a
    ``pytorch_model.bin`` (a pickle) is read as plain data only, and one that holds Python objects is refused
    (``CheckpointError``) as minimodel's own checkpoints are; an untied output projection is a ``CheckpointError``.
    ``runs_dir``: as the decoder family's ``from_hf`` takes it (a GGUF file is refused by its architecture here).
    """
    tf = outside.transformers()
    src = gguf_copy.local_source(outside.source(path), runs_dir, SUPPORTED_MODEL_TYPES, "encoder")
    hf_config = outside.read_config(src, SUPPORTED_MODEL_TYPES, "encoder")
    cfg = outside.model_config(hf_config_to_model_config, hf_config, src)
    outside.check_memory(cfg, src)
    outside.check_lengths(cfg, lengths or {}, src)
    cls = tf.XLMRobertaForMaskedLM if hf_config.model_type == "xlm-roberta" else tf.RobertaForMaskedLM
    hf_model, info = outside.load_weights(cls, src, hf_config)
    outside.missing_weights(info, src, {"lm_head.decoder.weight", "lm_head.decoder.bias"}, "*ForMaskedLM")
    model = RobertaMLM(cfg)
    model.load_state_dict(outside.convert(src, lambda: hf_state_dict_to_ours(hf_model.state_dict(), cfg, src.name)),
                          strict=True)
    model.tie_weights()
    return model.eval()


def _hf_config(cfg: ModelConfig, xlmr: bool = False, **extra: Any) -> Any:
    tf = outside.transformers()
    config_cls = tf.XLMRobertaConfig if xlmr else tf.RobertaConfig
    return config_cls(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden, num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads, intermediate_size=cfg.ffn, max_position_embeddings=cfg.max_positions,
        hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.attn_dropout,
        layer_norm_eps=cfg.layer_norm_eps, initializer_range=cfg.init_std, hidden_act="gelu",
        type_vocab_size=1, pad_token_id=cfg.pad_id, bos_token_id=0, eos_token_id=2, tie_word_embeddings=True,
        **extra,
    )


def to_hf(model: RobertaMLM, path: str | Path, xlmr: bool = False) -> None:
    """Save ``model`` as a HF ``RobertaForMaskedLM`` (``XLMRobertaForMaskedLM`` if ``xlmr``) directory.

    The primary head becomes ``lm_head``; secondary mini heads are not exported. Token-type embeddings
    are a single zero row (``type_vocab_size=1``), bos/eos ids are 0/2, pad is ``model.cfg.pad_id``.
    """
    tf = outside.transformers()
    model_cls = tf.XLMRobertaForMaskedLM if xlmr else tf.RobertaForMaskedLM
    hf_model = model_cls(_hf_config(model.cfg, xlmr))
    hf_model.load_state_dict(our_state_dict_to_hf(model), strict=True)
    hf_model.tie_weights()
    Path(path).mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(str(path))


def task_to_hf(body: RobertaMLM, head: torch.nn.Module, labels: list[str], qa: bool, path: str | Path) -> None:
    """Save a finetuned body and task head as ``RobertaForSequenceClassification`` (``ClassificationHead`` ->
    ``classifier.dense`` / ``classifier.out_proj``, label names as ``id2label``) or ``RobertaForQuestionAnswering``
    (``SpanHead.out`` -> ``qa_outputs``) directory; the MLM head is left out. Those classes read the last layer, the
    classifier its <s>: a head finetuned with another readout (``finetune.pool``, ``finetune.layer``) is refused."""
    layer, pooling = getattr(head, "layer", 0) or body.cfg.layers, getattr(head, "pooling", "first")
    if layer != body.cfg.layers or (not qa and pooling != "first"):
        raise ConfigError(f"export task=...: RobertaFor{'QuestionAnswering' if qa else 'SequenceClassification'} "
                          f"reads {'every token' if qa else '<s>'} of the last layer; this model was finetuned to read "
                          f"{'every token' if qa else pooling} of layer {layer} of {body.cfg.layers} (finetune.pool, "
                          f"finetune.layer): export its adapted language model (without task=)")
    tf = outside.transformers()
    encoder = {k: v for k, v in our_state_dict_to_hf(body).items() if k.startswith("roberta.")}
    heads = {k: v.detach().cpu() for k, v in head.state_dict().items()}
    if qa:
        hf_model = tf.RobertaForQuestionAnswering(_hf_config(body.cfg, num_labels=2))
        theirs = {"qa_outputs.weight": heads["out.weight"], "qa_outputs.bias": heads["out.bias"]}
    else:
        names = [str(label) for label in labels]
        hf_model = tf.RobertaForSequenceClassification(_hf_config(
            body.cfg, num_labels=len(names), id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)}))
        theirs = {f"classifier.{hf}.{p}": heads[f"{mine}.{p}"]
                  for mine, hf in (("dense", "dense"), ("out", "out_proj")) for p in ("weight", "bias")}
    hf_model.load_state_dict({**encoder, **theirs}, strict=True)
    Path(path).mkdir(parents=True, exist_ok=True)
    hf_model.save_pretrained(str(path))


def fast_tokenizer(sentencepiece_model: str | Path, model_max_length: int, causal: bool = False) -> Any:
    """A ``transformers`` fast tokenizer that gives a SentencePiece model's ids (our ``Tokenizer``): its pieces
    and scores as a ``tokenizers`` Unigram/BPE model with SentencePiece's normalisation (``transformers``'
    converter), RoBERTa's templates ``<s> A </s>`` and ``<s> A </s></s> B </s>`` (``causal``: ``<s> A``, a prompt
    that the model goes on from, and ``<s> A </s> B``), and the special tokens ``<s> <pad> </s> <unk> <mask>`` at
    ids 0-4."""
    tf = outside.transformers()
    from tokenizers import processors
    from transformers.convert_slow_tokenizer import SpmConverter

    class _Source:  # what the converter reads from a slow tokenizer: the model file
        vocab_file = str(sentencepiece_model)
        add_prefix_space = True

    tok = SpmConverter(_Source()).converted()
    single, pair = ("<s> $A", "<s> $A </s> $B") if causal else ("<s> $A </s>", "<s> $A </s> </s> $B </s>")
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                       special_tokens=[("<s>", 0), ("</s>", 2)])
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        unk_token="<unk>", pad_token="<pad>", mask_token="<mask>", model_max_length=model_max_length)

"""The model families, declared once. This is the only module that knows family names (``model.family``), as
``systems.py`` is for systems.

A family says which model class implements it (imported only when a stage builds a model: this module does not
import torch), what its LM heads learn (``Objective``: masked positions, or the next token at every position), how
many positions a sequence cannot use, where a classification head reads a sequence, whether its LM heads add an
output bias, which architecture options it accepts, and where its Hugging Face conversion lives. Stages, surgery,
the data module, FLOP counts and evaluation ask this module, never ``cfg.model.family``.

Adding a family: one ``ModelFamily(...)`` entry in ``REGISTRY`` plus the model file, which implements the contract
of ``RobertaMLM`` (docs/architecture.md, "How to add a model family")."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from minimodel.config.schema import ExperimentConfig, ModelConfig
from minimodel.errors import ConfigError

if TYPE_CHECKING:
    from torch import nn


class Objective(Enum):
    """What the LM heads of a family learn in steps 1, 1b and 2."""

    MASKED = "masked"  # BERT masking of data.mask_prob of the tokens; the loss at the masked positions
    CAUSAL = "causal"  # labels = the next token; every position but the last predicts


@dataclass(frozen=True)
class ModelFamily:
    name: str  # the value of model.family
    title: str
    model: str  # "module:Class", imported when a model is built (torch)
    objective: Objective
    position_offset: int  # positions a sequence cannot use: 2 for RoBERTa (max_positions = seq_len + 2), 0
    pooling: str  # where ClassificationHead reads a sequence: "first" (<s>) | "last" (the last real token)
    output_bias: bool  # the LM heads add a bias (trained in step 2 with the embeddings)
    # the readouts finetune.pool may name: "first" only where every position sees the whole input (not a causal LM,
    # whose first position sees only <s>), "last", "mean" (the real tokens); "" is ``pooling``
    pools: tuple[str, ...] = ("first", "last", "mean")
    # the architecture options it accepts: model.{norm, positions, activation} values, and whether model.bias and
    # model.tie_embeddings may be false
    norms: tuple[str, ...] = ("layernorm",)
    positions: tuple[str, ...] = ("learned",)
    activations: tuple[str, ...] = ("gelu",)
    untied: bool = False
    unbiased: bool = False
    llama: bool = False  # accepts the options of the Llama family as shipped (ModelConfig.llama_options)
    hf: str = ""  # the module of its Hugging Face import (``from_hf``) and export (``to_hf``); "" = none
    in_paper: bool = False  # the paper's experiments use this family (its claims' figures are about it)
    # its structure, for the memory plan's counts (``memory.py``): the embedding layer ends with a LayerNorm and makes
    # position ids per token (RoBERTa's, post-norm; a pre-norm decoder's first block normalises instead); an LM head
    # maps its input through a dense layer and GELU before its norm (RoBERTa's; a decoder's head is its final norm
    # and the projection); ``encode`` returns the last layer through the primary head's norm (a pre-norm stack's
    # final norm, which finetuning then computes)
    # its bf16 attention on the CPU runs in fp32 where it is differentiated (decoder.cpu_bf16_backward): the memory
    # plan counts the fp32 copies
    cpu_fp32_attention: bool = False
    embedding_norm: bool = True
    head_dense: bool = True
    encode_norm: bool = False

    @property
    def perplexity(self) -> bool:
        """Evaluation reports the target-language perplexity of every adaptation checkpoint (a causal LM's)."""
        return self.objective is Objective.CAUSAL


REGISTRY: dict[str, ModelFamily] = {f.name: f for f in (
    ModelFamily("encoder", "RoBERTa (masked LM)", "minimodel.models.model:RobertaMLM", Objective.MASKED,
                position_offset=2, pooling="first", output_bias=True, hf="minimodel.models.hf", in_paper=True),
    ModelFamily("decoder", "decoder-only (causal LM)", "minimodel.models.decoder:DecoderLM", Objective.CAUSAL,
                position_offset=0, pooling="last", pools=("last", "mean"), output_bias=False, norms=("layernorm", "rmsnorm"),
                positions=("learned", "rotary"), activations=("gelu", "gelu_tanh", "swiglu"), untied=True,
                unbiased=True, llama=True, hf="minimodel.models.hf_decoder", cpu_fp32_attention=True, embedding_norm=False, head_dense=False, encode_norm=True),
)}
DEFAULT = "encoder"


def get(name: str) -> ModelFamily:
    if name not in REGISTRY:
        raise ConfigError(f"unknown model.family {name!r}; valid families: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def of(model_cfg: ModelConfig) -> ModelFamily:
    return get(model_cfg.family)


def build(model_cfg: ModelConfig) -> nn.Module:
    """The one constructor of a model: the family's class, imported here."""
    module, _, cls = of(model_cfg).model.partition(":")
    return getattr(importlib.import_module(module), cls)(model_cfg)


def hf_module(model_cfg: ModelConfig | str) -> Any:
    """The family's Hugging Face conversion module (``from_hf``, ``to_hf``); a family name or a model config."""
    f = get(model_cfg) if isinstance(model_cfg, str) else of(model_cfg)
    if not f.hf:
        raise ConfigError(f"model.family={f.name} has no Hugging Face conversion")
    return importlib.import_module(f.hf)


def predicted_share(cfg: ExperimentConfig) -> float:
    """The share of positions that reach the LM head (p in the FLOP formulas): data.mask_prob, or 1 (causal)."""
    return cfg.data.mask_prob if of(cfg.model).objective is Objective.MASKED else 1.0


def predicted_rows(cfg: ExperimentConfig, sequences: int, seq_len: int) -> int:
    """The positions of ``sequences`` blocks of ``seq_len`` tokens that reach the LM heads (the rows of their
    logits): round(data.mask_prob x tokens) masked, or every position but each block's last (causal: the block
    holds no next token for it)."""
    if of(cfg.model).objective is Objective.MASKED:
        return round(cfg.data.mask_prob * sequences * seq_len)
    return sequences * (seq_len - 1)


def causal(model_cfg: ModelConfig) -> bool:
    return of(model_cfg).objective is Objective.CAUSAL


def check_model(cfg: ExperimentConfig, fail: Any) -> None:
    """The family's checks of a loaded config (``config.checks.validate`` runs them): a known family, options it
    accepts, and positions for data.seq_len."""
    m = cfg.model
    if m.family not in REGISTRY:
        fail(f"model.family must be one of {', '.join(REGISTRY)}, got {m.family!r}")
    f = of(m)
    for key, allowed in (("norm", f.norms), ("positions", f.positions), ("activation", f.activations)):
        if getattr(m, key) not in allowed:
            fail(f"model.{key}={getattr(m, key)!r} is not an option of model.family={f.name} "
                 f"({', '.join(allowed)})")
    if not m.tie_embeddings and not f.untied:
        fail(f"model.tie_embeddings=false: model.family={f.name} ties its output projection to the embeddings")
    if not m.bias and not f.unbiased:
        fail(f"model.bias=false: model.family={f.name} has biases")
    options = m.llama_options()
    if options and not f.llama:
        listed = ", ".join(f"model.{k}={v!r}" for k, v in options.items())
        fail(f"{listed}: options of the Llama family (model.family=decoder), not of model.family={f.name}")
    if m.rope_scaling != "none" and m.positions != "rotary":
        fail(f"model.rope_scaling={m.rope_scaling!r} scales rotary positions: it needs model.positions=rotary")
    if m.sliding_window:
        for key, length in sequence_lengths(cfg).items():
            if length > m.sliding_window:
                fail(f"{key} ({length}) exceeds model.sliding_window ({m.sliding_window}): minimodel attends over "
                     f"the whole causal context, which equals the window only up to its length")
    need = cfg.data.seq_len + f.position_offset
    if m.positions == "learned" and m.max_positions < need:
        extra = f" + {f.position_offset}" if f.position_offset else ""
        fail(f"model.max_positions ({m.max_positions}) must be at least data.seq_len{extra} ({need})")
    if f.objective is Objective.CAUSAL and cfg.adapt.init == "focus" and not m.tie_embeddings:
        fail("adapt.init=focus mixes the input embeddings only: use it with model.tie_embeddings=true")
    check_readout(cfg, fail)


def sequence_lengths(cfg: ExperimentConfig, tasks: bool = True) -> dict[str, int]:
    """The longest sequences the model runs, by the key that sets each: ``data.seq_len`` (steps 1-2) and, with
    ``tasks``, each finetuned task's ``max_len`` (steps 3-4); what a window or a source's positions must hold."""
    lengths = {"data.seq_len": cfg.data.seq_len}
    if tasks:
        lengths.update({f"tasks.{t}.max_len": cfg.tasks[t].max_len for t in cfg.finetune.tasks if t in cfg.tasks})
    return lengths


def check_readout(cfg: ExperimentConfig, fail: Any) -> None:
    """``finetune.pool`` is a readout of the family, ``finetune.layer`` a layer of the model (0: the last)."""
    f, pool, layer = of(cfg.model), cfg.finetune.pool, cfg.finetune.layer
    if pool and pool not in f.pools:
        why = (" (under the causal mask the first position sees only <s>: every input would read the same)"
               if pool == "first" and f.objective is Objective.CAUSAL else "")
        fail(f"finetune.pool={pool!r} is not a readout of model.family={f.name}: {', '.join(f.pools)}, or unset for "
             f"the family's own ({f.pooling}){why}")
    if not 0 <= layer <= cfg.model.layers:
        fail(f"finetune.layer={layer} is not a layer of the model: 0 (the last) or 1..{cfg.model.layers} "
             f"(model.layers)")


def readout(cfg: ExperimentConfig, layers: int) -> tuple[str, int]:
    """The (pool, layer) a classification head reads with ``cfg.finetune`` over a body of ``layers`` layers:
    ``finetune.pool`` or the family's own, ``finetune.layer`` or the last (a ``ConfigError`` naming the key when
    the body is shallower: a mini-model, or ``bridge.source``'s model)."""
    layer = cfg.finetune.layer or layers
    if layer > layers:
        raise ConfigError(f"finetune.layer={layer} is above the {layers} layers of the model finetuned here: set "
                          f"finetune.layer to 1..{layers} (or 0, the last)")
    return cfg.finetune.pool or of(cfg.model).pooling, layer


def max_tokens(model_cfg: ModelConfig) -> int:
    """The longest input the model reads: its learned positions less the family's offset (rotary: unbounded; the
    positions setting still bounds it, as a model trained on short blocks was never shown longer ones)."""
    return model_cfg.max_positions - of(model_cfg).position_offset

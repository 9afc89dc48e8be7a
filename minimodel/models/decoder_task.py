"""A finetuned decoder (``model.family: decoder``) as a ``transformers`` directory, and its loader.

``transformers``' ``GPT2ForSequenceClassification`` / ``LlamaForSequenceClassification`` score the last non-pad token
with one bias-free linear layer (``score``); our ``ClassificationHead`` is dense -> tanh -> out, with biases, and may
read the mean of the real tokens or a middle layer (``finetune.pool``, ``finetune.layer``), so it has no
``AutoModelForSequenceClassification`` class. The export is instead the adapted causal LM exactly as the
language-model export writes it (``hf_decoder.to_hf``: ``GPT2LMHeadModel`` / ``LlamaForCausalLM``, for
``AutoModelForCausalLM``) plus, beside it::

    task_head.safetensors   dense.weight (C, C), dense.bias (C), out.weight (K, C), out.bias (K)  (float32)
    task_head.json          format, labels, pooling "last" | "mean", layer k of layers L, hidden C, num_labels K,
                            padding "right"

``load_task_model(dir)`` (needs only ``torch`` and ``transformers``; nothing else of minimodel) runs
``AutoModel.from_pretrained(dir)`` (``GPT2Model`` / ``LlamaModel``) and the head, giving our logits: at the last layer
on its ``last_hidden_state`` (after the final norm, as ``DecoderLM.encode``'s), at a middle layer k on its
``hidden_states[k]`` (the residual stream after layer k) through the same final norm, as ``DecoderLM.encode(layer=k)``
reads it; pooled on each row's last real token, or the mean of its real tokens (right padding). Inputs are the
classification template ``<s> A </s>`` (pairs ``<s> A </s></s> B </s>``): the exported tokenizer's. Format 1 (before
``pooling`` could be "mean" and ``layer`` was recorded) reads the last token of the last layer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

HEAD_WEIGHTS, HEAD_CONFIG = "task_head.safetensors", "task_head.json"
FORMAT = "minimodel-decoder-classification/2"
READS = (FORMAT, "minimodel-decoder-classification/1")  # the formats load_task_model reads
POOLS = ("last", "mean")


class PooledHead(nn.Module):
    """``ClassificationHead`` at inference: dense -> tanh -> out on each row's last real token (``pooling`` "last") or
    the mean of its real tokens ("mean")."""

    def __init__(self, hidden: int, num_labels: int, pooling: str = "last") -> None:
        super().__init__()
        if pooling not in POOLS:
            raise ValueError(f"pooling must be one of {', '.join(POOLS)}, got {pooling!r}")
        self.pooling = pooling
        self.dense = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, num_labels)

    def forward(self, h: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """h: (B, T, C); ``attention_mask`` (B, T), right-padded (none: every position is real) -> (B, K)."""
        if self.pooling == "mean":
            real = (attention_mask.to(h.device, torch.bool) if attention_mask is not None
                    else torch.ones(h.shape[:2], dtype=torch.bool, device=h.device))[:, :, None]  # (B, T, 1)
            x = h.float().masked_fill(~real, 0).sum(1) / real.sum(1).clamp(min=1)  # (B, C), in fp32
        else:
            last = (attention_mask.sum(1) - 1 if attention_mask is not None
                    else torch.full((h.shape[0],), h.shape[1] - 1, device=h.device))
            x = h[torch.arange(h.shape[0], device=h.device), last.to(h.device)]  # (B, C)
        return self.out(torch.tanh(self.dense(x.to(self.dense.weight.dtype))))


LastTokenHead = PooledHead  # its name before the mean readout


def final_norm(base: nn.Module) -> nn.Module:
    """The base model's final norm: ``norm`` (the Llama family), ``ln_f`` (GPT-2)."""
    for name in ("norm", "ln_f"):
        if isinstance(getattr(base, name, None), nn.Module):
            return getattr(base, name)
    raise ValueError(f"{type(base).__name__} has no final norm named norm or ln_f: a middle-layer readout needs it")


class DecoderClassifier(nn.Module):
    """The exported classifier: ``model(input_ids, attention_mask) -> logits`` (B, K); ``labels[k]`` names class k.
    ``layer``: the layer the head reads (``layers``, the base model's depth: its ``last_hidden_state``)."""

    def __init__(self, base: nn.Module, head: PooledHead, labels: list[str], layer: int = 0, layers: int = 0) -> None:
        super().__init__()
        self.base, self.head, self.labels = base, head, labels
        self.layer, self.layers = layer or layers, layers

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        if self.layer == self.layers:
            h = self.base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, C)
        else:  # hidden_states[k]: after layer k, before any norm (0: the embeddings)
            states = self.base(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            h = final_norm(self.base)(states.hidden_states[self.layer])  # (B, T, C)
        return self.head(h, attention_mask)


def task_to_hf(body: Any, head: nn.Module, labels: list[str], qa: bool, path: str | Path) -> None:
    """Save a finetuned ``DecoderLM`` and its ``ClassificationHead`` (pooling "last" or "mean", at any layer) in the
    format of the module docstring; a question-answering model (``qa``) is refused (``ConfigError``)."""
    from safetensors.torch import save

    from minimodel.errors import ConfigError
    from minimodel.models.families import hf_module
    from minimodel.store import atomic

    if qa:
        raise ConfigError("export task=...: a question-answering decoder (model.family=decoder, span head) has no "
                          "transformers format here; export its adapted language model (without task=)")
    pooling = getattr(head, "pooling", "last")
    if pooling not in POOLS:
        raise ConfigError(f"export task=...: a decoder's classification head reads the last token or the mean of the "
                          f"real tokens, not {pooling!r}")
    layers = int(body.cfg.layers)
    layer = int(getattr(head, "layer", 0) or layers)
    out = Path(path)
    # the language-model export (hf_decoder.to_hf, reached through the family so that hf_decoder may import this
    # module), with the ids of the SentencePiece tokenizer export writes beside it: <s> 0, </s> 2, <pad> 1
    hf_module(body.cfg).to_hf(body, out, bos=0, eos=2, pad=1)
    weights = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in head.state_dict().items()}
    atomic.write_with(out / HEAD_WEIGHTS, lambda f: f.write(save(weights)))
    num_labels, hidden = (int(n) for n in weights["out.weight"].shape)
    reads = "h[last real token]" if pooling == "last" else "mean of h over the real tokens"
    atomic.write_json(out / HEAD_CONFIG, {
        "format": FORMAT, "labels": [str(x) for x in labels], "pooling": pooling, "layer": layer, "layers": layers,
        "padding": "right", "hidden": hidden, "num_labels": num_labels,
        "head": f"out(tanh(dense({reads}))), h = final_norm(hidden state after layer {layer} of {layers})",
        "loader": "minimodel.models.decoder_task.load_task_model"}, indent=2)


def load_task_model(path: str | Path, **from_pretrained: Any) -> DecoderClassifier:
    """The classifier ``task_to_hf`` wrote to ``path``, in eval mode; ``from_pretrained``: passed on to
    ``AutoModel.from_pretrained`` (e.g. ``dtype``)."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    d = Path(path)
    if not (d / HEAD_CONFIG).is_file():
        raise FileNotFoundError(f"{d} is not a decoder classifier export: it lacks {HEAD_CONFIG}")
    meta = json.loads((d / HEAD_CONFIG).read_text())
    if meta.get("format") not in READS:
        raise ValueError(f"{d / HEAD_CONFIG}: format {meta.get('format')!r}, expected {FORMAT!r}")
    labels, k = meta.get("labels"), meta.get("num_labels")
    if not isinstance(labels, list) or not isinstance(k, int) or len(labels) != k or len(set(map(str, labels))) != k:
        raise ValueError(f"{d / HEAD_CONFIG}: labels {labels!r} must name each of the head's num_labels={k!r} "
                         f"outputs once, in order (logit k is labels[k]): the file was edited, or is not an export")
    head = PooledHead(int(meta["hidden"]), k, str(meta.get("pooling", "last")))
    head.load_state_dict(load_file(str(d / HEAD_WEIGHTS)), strict=True)
    base = AutoModel.from_pretrained(str(d), **from_pretrained)
    layers = int(base.config.num_hidden_layers)
    layer = int(meta.get("layer") or layers)
    if meta.get("layers", layers) != layers or not 1 <= layer <= layers:
        raise ValueError(f"{d / HEAD_CONFIG}: layer {layer} of {meta.get('layers')} does not fit the {layers}-layer "
                         f"model beside it")
    return DecoderClassifier(base, head, [str(x) for x in meta["labels"]], layer, layers).eval()

"""A finetuned decoder (``model.family: decoder``) as a ``transformers`` directory, and its loader.

``transformers``' ``GPT2ForSequenceClassification`` / ``LlamaForSequenceClassification`` score the last non-pad token
with one bias-free linear layer (``score``); our ``ClassificationHead`` is dense -> tanh -> out, with biases, so it
has no ``AutoModelForSequenceClassification`` class. The export is instead the adapted causal LM exactly as the
language-model export writes it (``hf_decoder.to_hf``: ``GPT2LMHeadModel`` / ``LlamaForCausalLM``, for
``AutoModelForCausalLM``) plus, beside it::

    task_head.safetensors   dense.weight (C, C), dense.bias (C), out.weight (K, C), out.bias (K)  (float32)
    task_head.json          format, labels, pooling "last", hidden C, num_labels K, padding "right"

``load_task_model(dir)`` (needs only ``torch`` and ``transformers``; nothing else of minimodel) runs
``AutoModel.from_pretrained(dir)`` (``GPT2Model`` / ``LlamaModel``, whose ``last_hidden_state`` comes after the final
norm, as ``DecoderLM.encode``'s does) and the head on each row's last real token (right padding), giving our logits.
Inputs are the classification template ``<s> A </s>`` (pairs ``<s> A </s></s> B </s>``): the exported tokenizer's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

HEAD_WEIGHTS, HEAD_CONFIG = "task_head.safetensors", "task_head.json"
FORMAT = "minimodel-decoder-classification/1"


class LastTokenHead(nn.Module):
    """``ClassificationHead`` (pooling "last") at inference: dense -> tanh -> out on each row's last real token."""

    def __init__(self, hidden: int, num_labels: int) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, num_labels)

    def forward(self, h: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """h: (B, T, C); ``attention_mask`` (B, T), right-padded (none: every position is real) -> (B, K)."""
        last = (attention_mask.sum(1) - 1 if attention_mask is not None
                else torch.full((h.shape[0],), h.shape[1] - 1, device=h.device))
        x = h[torch.arange(h.shape[0], device=h.device), last.to(h.device)].to(self.dense.weight.dtype)
        return self.out(torch.tanh(self.dense(x)))


class DecoderClassifier(nn.Module):
    """The exported classifier: ``model(input_ids, attention_mask) -> logits`` (B, K); ``labels[k]`` names class k."""

    def __init__(self, base: nn.Module, head: LastTokenHead, labels: list[str]) -> None:
        super().__init__()
        self.base, self.head, self.labels = base, head, labels

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        h = self.base(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # (B, T, C)
        return self.head(h, attention_mask)


def task_to_hf(body: Any, head: nn.Module, labels: list[str], qa: bool, path: str | Path) -> None:
    """Save a finetuned ``DecoderLM`` and its ``ClassificationHead`` (pooling "last") in the format of the module
    docstring; a question-answering model (``qa``) is refused (``ConfigError``)."""
    from safetensors.torch import save

    from minimodel.errors import ConfigError
    from minimodel.models.families import hf_module
    from minimodel.store import atomic

    if qa:
        raise ConfigError("export task=...: a question-answering decoder (model.family=decoder, span head) has no "
                          "transformers format here; export its adapted language model (without task=)")
    pooling = getattr(head, "pooling", "last")
    if pooling != "last":
        raise ConfigError(f"export task=...: a decoder's classification head reads the last token, not {pooling!r}")
    out = Path(path)
    # the language-model export (hf_decoder.to_hf, reached through the family so that hf_decoder may import this
    # module), with the ids of the SentencePiece tokenizer export writes beside it: <s> 0, </s> 2, <pad> 1
    hf_module(body.cfg).to_hf(body, out, bos=0, eos=2, pad=1)
    weights = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in head.state_dict().items()}
    atomic.write_with(out / HEAD_WEIGHTS, lambda f: f.write(save(weights)))
    num_labels, hidden = (int(n) for n in weights["out.weight"].shape)
    atomic.write_json(out / HEAD_CONFIG, {
        "format": FORMAT, "labels": [str(x) for x in labels], "pooling": "last", "padding": "right",
        "hidden": hidden, "num_labels": num_labels, "head": "out(tanh(dense(h[last real token])))",
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
    if meta.get("format") != FORMAT:
        raise ValueError(f"{d / HEAD_CONFIG}: format {meta.get('format')!r}, expected {FORMAT!r}")
    head = LastTokenHead(int(meta["hidden"]), int(meta["num_labels"]))
    head.load_state_dict(load_file(str(d / HEAD_WEIGHTS)), strict=True)
    base = AutoModel.from_pretrained(str(d), **from_pretrained)
    return DecoderClassifier(base, head, [str(x) for x in meta["labels"]]).eval()

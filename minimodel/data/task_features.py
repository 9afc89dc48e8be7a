"""Featurisation of task records for the model (``<s> A </s></s> B </s>`` classification inputs, extractive-QA
windows over the context), batch collation (``pad_collate``) and QA span decoding (``decode_spans``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from minimodel.data.tokenizer import PAD, AnyTokenizer

if TYPE_CHECKING:  # torch is imported where tensors are made, so that reading tasks (the report) stays light
    import torch

Offset = tuple[int, int] | None


def encode_with_offsets(tokenizer: AnyTokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``text`` and each token's ``(start, end)`` character span in ``text``, without the
    leading whitespace a piece may carry (a bare "▁" gets an empty span)."""
    return tokenizer.encode_with_offsets(text)


def encode_classification(
    records: Sequence[dict[str, Any]], tokenizer: AnyTokenizer, text_fields: Sequence[str], max_len: int = 256
) -> dict[str, list]:
    """RoBERTa inputs ``<s> A </s>`` or ``<s> A </s></s> B </s>``, at most ``max_len`` tokens (the longer
    text loses its last token first), the records' int labels, and ``truncated``: whether a record lost tokens
    (its texts and special tokens were longer than ``max_len``)."""
    if len(text_fields) not in (1, 2):
        raise ValueError(f"text_fields must name one or two fields, got {list(text_fields)}")
    specials = 2 if len(text_fields) == 1 else 4
    if max_len <= specials:
        raise ValueError(f"max_len={max_len} leaves no room for text")
    columns = [tokenizer.encode([str(r[f]) for r in records]) for f in text_fields]
    bos, eos = tokenizer.specials.bos, tokenizer.specials.eos
    input_ids, truncated = [], []
    for ids in zip(*columns):
        if len(ids) == 1:
            input_ids.append([bos, *ids[0][: max_len - specials], eos])
        else:
            len_a, len_b = truncate_pair(len(ids[0]), len(ids[1]), max_len - specials)
            input_ids.append([bos, *ids[0][:len_a], eos, eos, *ids[1][:len_b], eos])
        truncated.append(len(input_ids[-1]) < specials + sum(map(len, ids)))
    return {"input_ids": input_ids, "label": [int(r["label"]) for r in records], "truncated": truncated}


def truncate_pair(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Lengths after removing tokens one at a time from the longer sequence (the second on ties)
    until both fit in ``budget`` (Hugging Face's ``longest_first``)."""
    while len_a + len_b > budget:
        if len_a > len_b:
            len_a -= 1
        else:
            len_b -= 1
    return len_a, len_b


def encode_qa(
    records: Sequence[dict[str, Any]],
    tokenizer: AnyTokenizer,
    max_len: int = 384,
    stride: int = 128,
    max_query_len: int = 64,
) -> dict[str, list]:
    """Extractive-QA features ``<s> Q </s></s> C </s>``, one per window over the context tokens;
    consecutive windows share ``stride`` tokens. Per feature: ``input_ids``, ``offsets`` (character
    span of each context token, None elsewhere), ``example_id`` and the answer's token positions
    ``start_positions``/``end_positions`` (from the first gold answer; 0, i.e. ``<s>``, when the answer
    is not wholly inside the window or the record has none)."""
    keys = ("input_ids", "offsets", "example_id", "start_positions", "end_positions")
    features: dict[str, list] = {k: [] for k in keys}
    bos, eos = tokenizer.specials.bos, tokenizer.specials.eos
    for rec in records:
        question = tokenizer.encode_one(rec["question"])[:max_query_len]
        ctx_ids, ctx_offsets = encode_with_offsets(tokenizer, rec["context"])
        prefix = len(question) + 3  # <s> Q </s></s>
        window = max_len - prefix - 1
        if window <= stride:
            raise ValueError(
                f"max_len={max_len} leaves {window} context tokens per window, not more than stride={stride}"
            )
        answer = _answer_tokens(rec, ctx_offsets)
        for begin in _window_starts(len(ctx_ids), window, stride):
            end = min(begin + window, len(ctx_ids))
            features["input_ids"].append([bos, *question, eos, eos, *ctx_ids[begin:end], eos])
            features["offsets"].append([None] * prefix + ctx_offsets[begin:end] + [None])
            features["example_id"].append(rec["id"])
            inside = answer is not None and begin <= answer[0] and answer[1] < end
            features["start_positions"].append(prefix + answer[0] - begin if inside else 0)
            features["end_positions"].append(prefix + answer[1] - begin if inside else 0)
    return features


def _window_starts(n_tokens: int, window: int, stride: int) -> list[int]:
    """First context token of each window; the last window ends at the last token."""
    starts = [0]
    while starts[-1] + window < n_tokens:
        starts.append(starts[-1] + window - stride)
    return starts


def _answer_tokens(rec: dict[str, Any], offsets: list[tuple[int, int]]) -> tuple[int, int] | None:
    """First and last context token overlapping the first gold answer's characters (None: no answer)."""
    answers = rec.get("answers") or {}
    if not answers.get("text"):
        return None
    first = answers["answer_start"][0]
    last = first + len(answers["text"][0])
    hits = [i for i, (a, b) in enumerate(offsets) if a < b and a < last and b > first]
    return (hits[0], hits[-1]) if hits else None


def decode_spans(
    start_logits: Sequence[Sequence[float]] | Sequence[torch.Tensor],
    end_logits: Sequence[Sequence[float]] | Sequence[torch.Tensor],
    offsets: Sequence[Sequence[Offset]],
    context: str,
    n_best: int = 20,
    max_answer_len: int = 30,
) -> str:
    """The best answer text over all features of one example (Hugging Face run_qa post-processing):
    per feature, pair the ``n_best`` highest start and end logits, skip spans that leave the context
    (offset None or past the feature's length, e.g. padding), end before start or are longer than
    ``max_answer_len`` tokens, and return the context text of the highest start+end score ("" if none)."""
    import torch

    best_score, best_text = float("-inf"), ""
    for starts, ends, offs in zip(start_logits, end_logits, offsets):
        starts = torch.as_tensor(starts, dtype=torch.float)[: len(offs)]
        ends = torch.as_tensor(ends, dtype=torch.float)[: len(offs)]
        for s in starts.topk(min(n_best, len(starts))).indices.tolist():
            for e in ends.topk(min(n_best, len(ends))).indices.tolist():
                if offs[s] is None or offs[e] is None or e < s or e - s + 1 > max_answer_len:
                    continue
                score = float(starts[s] + ends[e])
                if score > best_score:
                    best_score, best_text = score, context[offs[s][0] : offs[e][1]]
    return best_text


def feature_rows(features: dict[str, list]) -> list[dict[str, Any]]:
    """Dict of lists (as the encoders return) to one dict per feature (as a DataLoader expects)."""
    keys = list(features)
    return [dict(zip(keys, values)) for values in zip(*features.values())]


def pad_collate(batch: Sequence[dict[str, Any]], pad_id: int = PAD) -> dict[str, Any]:
    """Batch features: ``input_ids`` right-padded with ``pad_id`` (the model's ``<pad>``) plus ``attention_mask`` and
    ``padded`` (whether any row is padded: the model then needs no host sync to know); int fields (``label``,
    ``start_positions``, ...) as tensors; other fields (``offsets``, ``example_id``) as lists."""
    import torch

    width = max(len(f["input_ids"]) for f in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.bool)
    for i, f in enumerate(batch):
        input_ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"], dtype=torch.long)
        attention_mask[i, : len(f["input_ids"])] = True
    padded = any(len(f["input_ids"]) < width for f in batch)
    out: dict[str, Any] = {"input_ids": input_ids, "attention_mask": attention_mask, "padded": padded}
    for key in batch[0]:
        if key == "input_ids":
            continue
        values = [f[key] for f in batch]
        out[key] = torch.tensor(values, dtype=torch.long) if isinstance(values[0], int) else values
    return out

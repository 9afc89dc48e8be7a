"""Task heads and batched evaluation of a (body, head) pair on a task's featurised records: the task's metrics
(accuracy, macro-F1, per-class F1, confusion for classification; SQuAD / MLQA F1 and exact match for extractive
QA) and its predictions. Loading and featurising tasks is
``data.tasks`` (``TaskData``), which does not need torch."""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from minimodel.data.task_features import decode_spans, pad_collate
from minimodel.data.tasks import TaskData
from minimodel.metrics import MLQA_ARTICLES, classification_scores, mlqa_scores, squad_scores
from minimodel.models.model import RobertaMLM, task_logits
from minimodel.training.device import autocast_dtype


def task_head(task: TaskData, hidden: int, dropout: float, pooling: str = "first", layer: int = 0) -> nn.Module:
    """The task's head: spans for QA (every token scores: ``pooling`` does not apply), else a classification head
    pooling as ``pooling`` says (``finetune.pool``, or the family's: ``families.readout``); either reads the body's
    layer ``layer`` (0: the last)."""
    from minimodel.models.model import ClassificationHead, SpanHead

    return (SpanHead(hidden, layer) if task.is_qa
            else ClassificationHead(hidden, len(task.labels), dropout, pooling, layer))


@torch.no_grad()
def predict(body: RobertaMLM, head: nn.Module, features: list[dict[str, Any]], batch_size: int,
            device: torch.device, precision: str = "auto") -> list[Any]:
    """Per feature, in the order given: (predicted class id, class probabilities), or (start_logits, end_logits)
    trimmed to its length; ``precision``: ``evaluate.precision``. Batches are formed from features of similar length
    (``length_order``), so little of a forward pass is spent on padding."""
    body.eval()
    head.eval()
    half = autocast_dtype(device, precision)  # auto: bf16 where native, fp16 on older CUDA cards, fp32 on the CPU
    order = length_order(features)
    out: list[Any] = [None] * len(features)
    for i in range(0, len(order), batch_size):
        where = order[i:i + batch_size]
        chunk = [features[j] for j in where]
        batch = pad_collate(chunk, body.cfg.pad_id)
        ids = batch["input_ids"].to(device)
        with torch.autocast(device.type, dtype=half) if half is not None else contextlib.nullcontext():
            logits = task_logits(body, head, ids, batch["attention_mask"].to(device), batch["padded"])
        if isinstance(logits, tuple):
            start, end = (t.float().cpu() for t in logits)
            results = [(start[k, :len(f["input_ids"])], end[k, :len(f["input_ids"])]) for k, f in enumerate(chunk)]
        else:
            logits = logits.float().cpu()
            results = list(zip(logits.argmax(-1).tolist(), logits.softmax(-1).tolist()))
        for j, result in zip(where, results):
            out[j] = result
    return out


def length_order(features: list[dict[str, Any]]) -> list[int]:
    """Feature indices by length (longest first; ties in their given order): consecutive batches of it pad little."""
    return sorted(range(len(features)), key=lambda j: -len(features[j]["input_ids"]))


def _answers(task: TaskData, records: list[dict[str, Any]], features: list[dict[str, Any]],
             predictions: list[Any]) -> dict[str, str]:
    by_example: dict[str, list] = defaultdict(list)
    for f, (start, end) in zip(features, predictions):
        by_example[f["example_id"]].append((start, end, f["offsets"]))
    answers = {}
    for rec in records:
        parts = by_example.get(rec["id"], [])
        answers[rec["id"]] = decode_spans([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts],
                                          rec["context"], task.cfg.n_best, task.cfg.max_answer_len)
    return answers


def score(task: TaskData, records: list[dict[str, Any]], features: list[dict[str, Any]], predictions: list[Any],
          lang: str) -> dict[str, float]:
    """The task's metrics (``task.metrics``): accuracy, macro-F1, per-class F1, confusion counts for
    classification (torchmetrics); F1 / exact match for QA (MLQA's normalisation for MLQA, SQuAD's otherwise)."""
    if not task.is_qa:
        preds = torch.tensor([p for p, _ in predictions])
        target = torch.tensor([f["label"] for f in features])
        return classification_scores(preds, target, task.labels, task.metrics)
    answers = _answers(task, records, features, predictions)
    refs = {rec["id"]: list(rec["answers"]["text"]) for rec in records}
    if task.name == "mlqa" and lang in MLQA_ARTICLES:
        s = mlqa_scores(answers, refs, lang)
    else:
        s = squad_scores(answers, refs)
    return {m: s[m] for m in task.metrics}


def prediction_rows(task: TaskData, records: list[dict[str, Any]], features: list[dict[str, Any]],
                    predictions: list[Any]) -> list[dict[str, Any]]:
    """One row per example: ``id`` (the record's: its ``tasks.X.id_field`` or ``id`` column; else its 0-based
    position in the file), ``gold``, ``predicted`` and, for
    classification, ``probabilities`` by label (QA: the gold answers and the predicted answer text)."""
    if task.is_qa:
        answers = _answers(task, records, features, predictions)
        return [{"id": rec["id"], "gold": list(rec["answers"]["text"]), "predicted": answers[rec["id"]]}
                for rec in records]
    labels = task.labels
    return [{"id": rec.get("id", i), "gold": labels[f["label"]], "predicted": labels[p],
             "probabilities": {label: round(q, 6) for label, q in zip(labels, probs)}}
            for i, (rec, f, (p, probs)) in enumerate(zip(records, features, predictions))]


def evaluate(task: TaskData, body: RobertaMLM, head: nn.Module, records: list[dict[str, Any]],
             features: list[dict[str, Any]], lang: str, batch_size: int, device: torch.device,
             precision: str = "auto") -> dict[str, float]:
    return score(task, records, features, predict(body, head, features, batch_size, device, precision), lang)

"""One interface over every downstream task: English train/dev/test and target-language test sets,
featurised with a given tokenizer, plus batched evaluation of a (body, head) pair.

Hub tasks (xnli, pawsx, mlqa, xquad) train on the English split of ``TaskSpec.train_task`` (SQuAD
v1.1 for the QA tasks); local tasks are ``LocalClassificationTask`` directories."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from minimodel.config import TaskConfig
from minimodel.data.tasks import (LocalClassificationTask, decode_spans, encode_classification, encode_qa,
                                  feature_rows, get_task, load_task_split, pad_collate)
from minimodel.data.tokenizer import Tokenizer
from minimodel.metrics import MLQA_ARTICLES, accuracy, mlqa_scores, squad_scores
from minimodel.model import RobertaMLM


@dataclass
class TaskData:
    """Splits and featurisation of one task."""

    name: str
    cfg: TaskConfig

    def __post_init__(self) -> None:
        self.local = LocalClassificationTask(self.cfg.source, self.cfg.text_fields, self.cfg.label_field) \
            if self.cfg.kind == "local" else None
        self.spec = None if self.local else get_task(self.name)

    @property
    def is_qa(self) -> bool:
        return self.spec is not None and self.spec.is_qa

    @property
    def labels(self) -> tuple[str, ...]:
        if self.local is not None:
            return self.local.labels
        return self.spec.labels  # type: ignore[union-attr]

    @property
    def text_fields(self) -> tuple[str, ...]:
        return self.local.text_fields if self.local is not None else self.spec.text_fields  # type: ignore[union-attr]

    @property
    def metric(self) -> str:
        return "f1" if self.is_qa else "accuracy"

    def languages(self, target_langs: list[str]) -> list[str]:
        """Evaluation languages: ``tasks.X.langs`` or the experiment's targets this task has."""
        if self.cfg.langs:
            return list(self.cfg.langs)
        if self.local is not None:
            return [lang for lang in target_langs if any(self.local.root.glob(f"test.{lang}.*"))]
        return [lang for lang in target_langs if lang in self.spec.languages]  # type: ignore[union-attr]

    def records(self, split: str, lang: str = "en") -> list[dict[str, Any]]:
        """``split`` is train, dev or test (English), or test in ``lang``."""
        if self.local is not None:
            return self.local.load("test", lang) if split == "test" else self.local.load(split)
        spec = self.spec
        assert spec is not None
        if split in ("train", "dev"):
            task = spec.train_task
            source = (self.cfg.train_source if task != self.name else self.cfg.source) or None
            hub_split = "train" if split == "train" else "validation"
            return load_task_split(task, "en", hub_split, source)
        return load_task_split(self.name, lang, spec.eval_split, self.cfg.source or None)

    def features(self, records: list[dict[str, Any]], tokenizer: Tokenizer) -> list[dict[str, Any]]:
        if self.is_qa:
            return feature_rows(encode_qa(records, tokenizer, self.cfg.max_len, self.cfg.stride))
        return feature_rows(encode_classification(records, tokenizer, self.text_fields, self.cfg.max_len))


def task_head(task: TaskData, hidden: int, dropout: float) -> nn.Module:
    from minimodel.model import ClassificationHead, SpanHead

    return SpanHead(hidden) if task.is_qa else ClassificationHead(hidden, len(task.labels), dropout)


@torch.no_grad()
def predict(body: RobertaMLM, head: nn.Module, features: list[dict[str, Any]], batch_size: int,
            device: torch.device) -> list[Any]:
    """Per feature: the predicted class id, or (start_logits, end_logits) trimmed to its length."""
    body.eval()
    head.eval()
    half = torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float16
    out: list[Any] = []
    for i in range(0, len(features), batch_size):
        chunk = features[i:i + batch_size]
        batch = pad_collate(chunk, body.cfg.pad_id)
        ids = batch["input_ids"].to(device)
        with torch.autocast(device.type, dtype=half, enabled=device.type == "cuda"):
            logits = head(body.encode(ids))
        if isinstance(logits, tuple):
            start, end = (t.float().cpu() for t in logits)
            out.extend((start[j, :len(f["input_ids"])], end[j, :len(f["input_ids"])]) for j, f in enumerate(chunk))
        else:
            out.extend(logits.float().argmax(-1).cpu().tolist())
    return out


def score(task: TaskData, records: list[dict[str, Any]], features: list[dict[str, Any]], predictions: list[Any],
          lang: str) -> dict[str, float]:
    """accuracy for classification; F1/EM (MLQA's normalisation for MLQA, SQuAD's otherwise) for QA."""
    if not task.is_qa:
        preds = torch.tensor(predictions)
        target = torch.tensor([f["label"] for f in features])
        return {"accuracy": accuracy(preds, target, len(task.labels))}
    by_example: dict[str, list] = defaultdict(list)
    for f, (start, end) in zip(features, predictions):
        by_example[f["example_id"]].append((start, end, f["offsets"]))
    answers = {}
    for rec in records:
        parts = by_example.get(rec["id"], [])
        answers[rec["id"]] = decode_spans([p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts],
                                          rec["context"], task.cfg.n_best, task.cfg.max_answer_len)
    refs = {rec["id"]: list(rec["answers"]["text"]) for rec in records}
    if task.name == "mlqa" and lang in MLQA_ARTICLES:
        s = mlqa_scores(answers, refs, lang)
    else:
        s = squad_scores(answers, refs)
    return {"f1": s["f1"], "exact_match": s["exact_match"]}


def evaluate(task: TaskData, body: RobertaMLM, head: nn.Module, records: list[dict[str, Any]],
             features: list[dict[str, Any]], lang: str, batch_size: int, device: torch.device) -> dict[str, float]:
    return score(task, records, features, predict(body, head, features, batch_size, device), lang)


def majority_baseline(task: TaskData, langs: list[str]) -> dict[str, float]:
    """Accuracy of always predicting the most frequent label of the English training data, per language."""
    if task.is_qa:
        return {}
    counts = Counter(r["label"] for r in task.records("train"))
    top = counts.most_common(1)[0][0]
    out = {}
    for lang in langs:
        labels = [int(r["label"]) for r in task.records("test", lang)]
        out[lang] = 100.0 * sum(label == top for label in labels) / max(1, len(labels))
    return out

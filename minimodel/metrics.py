"""Evaluation metrics: SQuAD v1.1 and MLQA exact match / F1, and classification accuracy.

``squad_scores`` follows the official SQuAD v1.1 script (``evaluate-v1.1.py``) and ``mlqa_scores`` the
official MLQA script (``mlqa_evaluation_v1.py``): per question the maximum over the gold answers,
averaged over all reference questions (a question without a prediction scores 0), times 100.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import torch
from torchmetrics.functional.classification import (
    multiclass_accuracy,
    multiclass_confusion_matrix,
    multiclass_f1_score,
)

MLQA_ARTICLES = {
    "en": r"\b(a|an|the)\b",
    "es": r"\b(un|una|unos|unas|el|la|los|las)\b",
    "vi": r"\b(của|là|cái|chiếc|những)\b",
    "de": r"\b(ein|eine|einen|einem|eines|einer|der|die|das|den|dem|des)\b",
    "ar": r"\sال^|ال",  # verbatim from the official script (the first alternative never matches)
    "hi": None,
    "zh": None,
}
# The official script's CJK test: the CJK Unified Ideographs block up to U+9FA5.
_CJK = re.compile("[\u4e00-\u9fa5]")

Normalizer = Callable[[str], list[str]]


def is_mlqa_punct(ch: str) -> bool:
    """MLQA's punctuation: ASCII punctuation or any character in a Unicode punctuation category (P*)."""
    return ch in string.punctuation or unicodedata.category(ch).startswith("P")


def squad_normalize(text: str) -> list[str]:
    """SQuAD v1.1 answer tokens: lowercase, drop ASCII punctuation and a/an/the, split on whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def mixed_segmentation(text: str) -> list[str]:
    """MLQA's Chinese tokenisation: each CJK character (or punctuation mark) is a token; the runs
    between them are split on whitespace."""
    tokens: list[str] = []
    run = ""
    for ch in text:
        if _CJK.search(ch) or is_mlqa_punct(ch):
            tokens.extend(run.split())
            run = ""
            tokens.append(ch)
        else:
            run += ch
    tokens.extend(run.split())
    return tokens


def mlqa_normalize(text: str, lang: str) -> list[str]:
    """MLQA answer tokens for ``lang``: lowercase, drop Unicode punctuation and the language's
    articles, then whitespace tokens (mixed segmentation for zh)."""
    _check_mlqa_lang(lang)
    text = "".join(ch for ch in text.lower() if not is_mlqa_punct(ch))
    articles = MLQA_ARTICLES[lang]
    if articles is not None:
        text = re.sub(articles, " ", text)
    tokens = mixed_segmentation(text) if lang == "zh" else text.split()
    return [t for t in tokens if t.strip()]


def _check_mlqa_lang(lang: str) -> None:
    if lang not in MLQA_ARTICLES:
        raise ValueError(f"MLQA normalisation has no rules for language '{lang}' (known: {', '.join(MLQA_ARTICLES)})")


def f1(prediction: list[str], gold: list[str]) -> float:
    """Token-overlap F1 of two normalised token lists (0 when they share no token)."""
    same = sum((Counter(prediction) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def qa_scores(
    predictions: Mapping[str, str], references: Mapping[str, Sequence[str]], normalize: Normalizer
) -> dict[str, float]:
    """Exact match and F1 (both x100) over ``references``, best gold answer per question."""
    if not references:
        raise ValueError("no reference answers to score")
    em_total = f1_total = 0.0
    for qid, golds in references.items():
        if qid not in predictions:
            continue  # unanswered: scores 0, still counted
        pred = normalize(predictions[qid])
        gold_tokens = [normalize(g) for g in golds]
        em_total += max(float(pred == g) for g in gold_tokens)
        f1_total += max(f1(pred, g) for g in gold_tokens)
    n = len(references)
    return {"exact_match": 100.0 * em_total / n, "f1": 100.0 * f1_total / n}


def squad_scores(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """SQuAD v1.1 ``{"exact_match", "f1"}`` (x100) of predicted answer texts by question id."""
    return qa_scores(predictions, references, squad_normalize)


def mlqa_scores(
    predictions: Mapping[str, str], references: Mapping[str, Sequence[str]], lang: str
) -> dict[str, float]:
    """MLQA ``{"exact_match", "f1"}`` (x100) with the normalisation of context language ``lang``
    (one of en, es, de, vi, ar, hi, zh)."""
    _check_mlqa_lang(lang)
    return qa_scores(predictions, references, lambda text: mlqa_normalize(text, lang))


def accuracy(preds: torch.Tensor, target: torch.Tensor, num_classes: int) -> float:
    """Micro-averaged accuracy x100; ``preds`` are class ids ``(N,)`` or logits ``(N, num_classes)``."""
    return 100.0 * multiclass_accuracy(preds, target, num_classes=num_classes, average="micro").item()


def classification_scores(preds: torch.Tensor, target: torch.Tensor, labels: Sequence[str],
                          metrics: Sequence[str]) -> dict[str, float]:
    """``metrics`` (``task_metrics.CLASSIFICATION``) of class ids ``preds`` against ``target`` with torchmetrics, as
    percentages (counts for the confusion matrix): ``accuracy``, ``macro_f1`` (over the classes present in the gold
    labels or the predictions), ``per_class_f1`` (``f1/LABEL``), ``confusion`` (``confusion/GOLD/PREDICTED``)."""
    k = len(labels)
    out: dict[str, float] = {}
    for m in metrics:
        if m == "accuracy":
            out[m] = accuracy(preds, target, k)
        elif m == "macro_f1":
            out[m] = 100.0 * multiclass_f1_score(preds, target, num_classes=k, average="macro").item()
        elif m == "per_class_f1":
            per = multiclass_f1_score(preds, target, num_classes=k, average="none")
            out.update({f"f1/{label}": 100.0 * float(v) for label, v in zip(labels, per.tolist())})
        elif m == "confusion":
            cm = multiclass_confusion_matrix(preds, target, num_classes=k).tolist()
            out.update({f"confusion/{labels[g]}/{labels[p]}": float(cm[g][p]) for g in range(k) for p in range(k)})
        else:
            raise ValueError(f"unknown classification metric {m!r}")
    return out

"""Which metrics a task reports, and the majority-class baseline of each. Nothing here imports torch.

A classification task reports ``tasks.X.metrics`` from ``CLASSIFICATION`` (default ``[accuracy]``): ``accuracy``,
``macro_f1`` (the mean F1 over the classes that occur in the gold labels or the predictions, as torchmetrics'
``average="macro"``), ``per_class_f1`` (one result row ``f1/LABEL`` per class) and ``confusion`` (rows
``confusion/GOLD/PREDICTED`` holding counts). Extractive QA reports ``f1`` and ``exact_match``. ``main_metric``
(a scalar one of those: accuracy or macro_f1; QA: f1 or exact_match) drives the targets, speedups and plots of
the report; results rows carry the metric's name. Evaluation computes them with torchmetrics
(``minimodel.metrics.classification_scores``); the baselines here are the same definitions for a constant
prediction, which need no model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

CLASSIFICATION = ("accuracy", "macro_f1", "per_class_f1", "confusion")
QA = ("f1", "exact_match")
MAIN = {"classification": ("accuracy", "macro_f1"), "qa": QA}


def task_kind(is_qa: bool) -> str:
    return "qa" if is_qa else "classification"


def metrics_of(is_qa: bool, metrics: Sequence[str], main_metric: str) -> tuple[list[str], str]:
    """(the metrics to compute, the main one) with defaults filled in; the main one is always computed."""
    main = main_metric or ("f1" if is_qa else "accuracy")
    chosen = list(metrics) or (list(QA) if is_qa else ["accuracy"])
    if main not in chosen:
        chosen.insert(0, main)
    return chosen, main


def check_metrics(task: str, is_qa: bool, metrics: Sequence[str], main_metric: str) -> str:
    """"" when ``tasks.TASK.metrics`` / ``main_metric`` are valid for the task's kind, else what is wrong."""
    kind = task_kind(is_qa)
    valid = QA if is_qa else CLASSIFICATION
    unknown = [m for m in metrics if m not in valid]
    if unknown:
        return (f"tasks.{task}.metrics: unknown metric(s) {unknown} for a {kind} task; valid: "
                f"{', '.join(valid)}")
    if main_metric and main_metric not in MAIN[kind]:
        return (f"tasks.{task}.main_metric={main_metric!r}: the main metric of a {kind} task is one of "
                f"{', '.join(MAIN[kind])}")
    return ""


def row_names(metrics: Sequence[str], labels: Sequence[str]) -> list[str]:
    """The result-row metric names ``metrics`` expand to (per-class F1 and the confusion matrix are one row per
    class / per cell)."""
    out: list[str] = []
    for m in metrics:
        if m == "per_class_f1":
            out += [f"f1/{label}" for label in labels]
        elif m == "confusion":
            out += [f"confusion/{g}/{p}" for g in labels for p in labels]
        else:
            out.append(m)
    return out


def scores_from_counts(gold: Sequence[int], predicted: Sequence[int], labels: Sequence[str],
                       metrics: Sequence[str]) -> dict[str, float]:
    """The classification metrics of label ids ``predicted`` against ``gold``, in plain Python (percentages;
    counts for the confusion matrix): the definitions evaluation computes with torchmetrics."""
    n = len(gold)
    pairs = Counter(zip(gold, predicted))
    out: dict[str, float] = {}
    f1s: dict[int, float | None] = {}
    for c in range(len(labels)):
        tp = pairs[(c, c)]
        fp = sum(v for (g, p), v in pairs.items() if p == c and g != c)
        fn = sum(v for (g, p), v in pairs.items() if g == c and p != c)
        f1s[c] = None if tp + fp + fn == 0 else 100.0 * 2 * tp / (2 * tp + fp + fn)
    for m in metrics:
        if m == "accuracy":
            out[m] = 100.0 * sum(v for (g, p), v in pairs.items() if g == p) / max(1, n)
        elif m == "macro_f1":
            present = [f for f in f1s.values() if f is not None]
            out[m] = sum(present) / len(present) if present else 0.0
        elif m == "per_class_f1":
            out.update({f"f1/{labels[c]}": f if f is not None else 0.0 for c, f in f1s.items()})
        elif m == "confusion":
            out.update({f"confusion/{labels[g]}/{labels[p]}": float(pairs[(g, p)])
                        for g in range(len(labels)) for p in range(len(labels))})
    return out


def majority_scores(train_labels: Sequence[int], test_labels: Sequence[int], labels: Sequence[str],
                    metrics: Sequence[str]) -> dict[str, float]:
    """Every metric of always predicting the most frequent training label (ties: the one seen first)."""
    top = Counter(train_labels).most_common(1)[0][0]
    return scores_from_counts(list(test_labels), [top] * len(test_labels), labels, metrics)


CHANCE = "chance/"
"""The prefix of an input-blind baseline's score among a task's baselines (``chance/macro_f1``)."""
CHANCE_METRICS = ("accuracy", "macro_f1")
"""The scalar metrics with an input-blind baseline (``chance_scores``)."""


def chance_scores(train_labels: Sequence[int], test_labels: Sequence[int], labels: Sequence[str],
                  metrics: Sequence[str]) -> dict[str, float]:
    """In each of ``metrics`` that is scalar (``CHANCE_METRICS``), the best score of a predictor that ignores its input:
    any constant label, scored on this test set (the best of them: as strict as a constant gets), or labels drawn at
    random with the training labels' frequencies p (its expected score: accuracy sum p_l q_l, q the test frequencies;
    per-label F1 2 p_l q_l / (p_l + q_l), from its expected precision q_l and recall p_l, averaged over the labels
    drawn or present, as macro-F1 averages). A model below it has learned nothing usable in that metric; majority-
    class macro-F1 (one label's F1 over all labels) is far easier to beat."""
    wanted = [m for m in metrics if m in CHANCE_METRICS]
    if not wanted or not test_labels:
        return {}
    n, total = len(test_labels), len(train_labels)
    best = {m: max(scores_from_counts(list(test_labels), [c] * n, labels, wanted)[m] for c in range(len(labels)))
            for m in wanted}
    p = Counter(train_labels)
    q = Counter(test_labels)
    freq = {c: p[c] / total for c in range(len(labels))} if total else {}
    share = {c: q[c] / n for c in range(len(labels))}
    drawn = {"accuracy": 100.0 * sum(freq.get(c, 0.0) * share[c] for c in share)}
    present = [c for c in share if freq.get(c, 0.0) > 0 or share[c] > 0]
    drawn["macro_f1"] = 100.0 * sum(2 * freq.get(c, 0.0) * share[c] / (freq.get(c, 0.0) + share[c])
                                    for c in present) / max(1, len(present))
    return {m: max(best[m], drawn[m]) for m in wanted}


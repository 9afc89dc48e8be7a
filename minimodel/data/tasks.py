"""The downstream tasks of an experiment (``tasks:`` in its config): ``TaskData``, a hub task (``data.hub_tasks``) or a
user-defined local one (``data.task_files.LocalClassificationTask``), with its splits, featurisation
(``data.task_features``), metrics and majority baseline."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minimodel.config.schema import TaskConfig
from minimodel.data.hub_tasks import get_task, load_task_split
from minimodel.data.task_features import encode_classification, encode_qa, feature_rows
from minimodel.data.task_files import LocalClassificationTask, find_split_file, has_split
from minimodel.data.tokenizer import AnyTokenizer
from minimodel.errors import TaskDataError
from minimodel.store import atomic
from minimodel.task_metrics import CHANCE, chance_scores, majority_scores, metrics_of


@dataclass
class TaskData:
    """Splits and featurisation of one task."""

    name: str
    cfg: TaskConfig
    saved_labels: tuple[str, ...] | None = None  # the labels a finetuned model was trained with (evaluation)

    def __post_init__(self) -> None:
        self.local = LocalClassificationTask(
            self.cfg.source, self.cfg.text_fields, self.cfg.label_field, self.saved_labels, name=self.name,
            labels_source="" if self.saved_labels is None else "the model was finetuned on", id_field=self.cfg.id_field,
        ) if self.cfg.kind == "local" else None
        self.spec = None if self.local else get_task(self.name)
        if self.spec is not None and self.saved_labels is not None and tuple(self.saved_labels) != self.spec.labels:
            raise TaskDataError(f"tasks.{self.name}: the model was finetuned with labels {list(self.saved_labels)}, "
                                f"but {self.name} has {list(self.spec.labels)}")

    def train_file(self) -> Path | None:
        """The local file the English training data comes from (None: the Hugging Face hub)."""
        if self.local is not None:
            return find_split_file(self.local.root, "train", None)
        spec = self.spec
        assert spec is not None
        source = self.cfg.train_source if spec.train_task != self.name else self.cfg.source
        if not source:
            return None
        path = Path(source)
        return find_split_file(path, "train", "en") if path.is_dir() else path

    def train_sha256(self) -> str:
        """sha256 of ``train_file()`` ("" for hub data): what a finetuned model records to detect a changed file."""
        path = self.train_file()
        return "" if path is None else atomic.file_sha256(path)

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
        """The main metric (``tasks.X.main_metric``; accuracy, or F1 for QA)."""
        return metrics_of(self.is_qa, self.cfg.metrics, self.cfg.main_metric)[1]

    @property
    def metrics(self) -> list[str]:
        """The metrics evaluation reports (``tasks.X.metrics``, the main one included)."""
        return metrics_of(self.is_qa, self.cfg.metrics, self.cfg.main_metric)[0]

    def languages(self, target_langs: list[str]) -> list[str]:
        """Evaluation languages: ``tasks.X.langs`` or the experiment's targets this task has."""
        if self.cfg.langs:
            return list(self.cfg.langs)
        if self.local is not None:
            return [lang for lang in target_langs if has_split(self.local.root, "test", lang)]
        return [lang for lang in target_langs if lang in self.spec.languages]  # type: ignore[union-attr]

    def records(self, split: str, lang: str = "en") -> list[dict[str, Any]]:
        """``split`` is train, dev or test (English), or test or dev in ``lang`` (a local task's ``dev.{lang}``: for
        choosing settings without a test set)."""
        if self.local is not None:
            if split == "test" or (split == "dev" and lang != "en"):
                return self.local.load(split, lang)
            return self.local.load(split)
        spec = self.spec
        assert spec is not None
        if split in ("train", "dev"):
            task = spec.train_task
            source = (self.cfg.train_source if task != self.name else self.cfg.source) or None
            hub_split = "train" if split == "train" else "validation"
            return load_task_split(task, "en", hub_split, source, "" if spec.is_qa else self.cfg.id_field)
        return load_task_split(self.name, lang, spec.eval_split, self.cfg.source or None,
                               "" if spec.is_qa else self.cfg.id_field)

    def train_records(self) -> list[dict[str, Any]]:
        """The English training examples step 3 uses: every one, or ``max_train_examples`` of them chosen by
        ``train_subset`` (``subset_indices``), in file order."""
        records = self.records("train")
        n = self.cfg.max_train_examples
        if not n or n >= len(records):
            return records
        if self.cfg.train_subset == "first":
            return records[:n]
        labels = None if self.is_qa else [int(r["label"]) for r in records]
        if labels is not None and n < len(set(labels)):
            raise TaskDataError(f"tasks.{self.name}.max_train_examples={n} is fewer than the {len(set(labels))} labels "
                                f"of {self.split_file('train') or 'its training data'}: a stratified subset needs one "
                                f"example of each (raise it, or set 0 for all)")
        return [records[i] for i in subset_indices(labels, len(records), n)]

    def split_file(self, split: str, lang: str = "en") -> str:
        """The file ``records(split, lang)`` reads ("" when it comes from the hub), for messages."""
        if self.local is not None:
            local = split == "test" or (split == "dev" and lang != "en")
            return str(find_split_file(self.local.root, split, lang if local else None))
        if split == "train":
            return str(self.train_file() or "")
        spec = self.spec
        assert spec is not None
        english = split == "dev" and spec.train_task != self.name  # read from the training task's source
        source = self.cfg.train_source if english else self.cfg.source
        if not source:
            return ""
        path = Path(source)
        hub_split = "validation" if split == "dev" else spec.eval_split
        return str(find_split_file(path, hub_split, lang) if path.is_dir() else path)

    def featurise(self, records: list[dict[str, Any]], tokenizer: AnyTokenizer) -> tuple[list[dict[str, Any]], int | None]:
        """The features of ``records`` and how many records were cut to ``max_len`` (None for QA: its windows over
        the context, with a stride, cover all of it; a question longer than its 64 tokens is cut, not counted)."""
        if self.is_qa:
            return feature_rows(encode_qa(records, tokenizer, self.cfg.max_len, self.cfg.stride)), None
        columns = encode_classification(records, tokenizer, self.text_fields, self.cfg.max_len)
        cut = columns.pop("truncated")
        return feature_rows(columns), sum(cut)

    def features(self, records: list[dict[str, Any]], tokenizer: AnyTokenizer) -> list[dict[str, Any]]:
        return self.featurise(records, tokenizer)[0]


SUBSET_SEED = 0
"""The seed of a training subset's draw: one subset per task, the same for every finetuning seed (seeds then measure
training, not which examples were drawn)."""


def subset_indices(labels: list[int] | None, total: int, n: int, seed: int = SUBSET_SEED) -> list[int]:
    """``n`` of ``total`` example indices, sorted. With ``labels`` (one per example): stratified by label, each label's
    share in proportion to its count (largest remainders, ties to the lower label id), at least one example of every
    label, drawn within the label by a ``random.Random(seed)`` shuffle; without (QA): a seeded uniform draw."""
    import random

    rng = random.Random(seed)
    if labels is None:
        return sorted(rng.sample(range(total), n))
    by_label: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        by_label.setdefault(label, []).append(i)
    exact = {label: n * len(idx) / total for label, idx in by_label.items()}
    quota = {label: max(1, int(q)) for label, q in exact.items()}
    order = sorted(by_label, key=lambda label: (-(exact[label] - int(exact[label])), label))
    while sum(quota.values()) < n:  # the largest remainders first
        for label in order:
            if sum(quota.values()) < n and quota[label] < len(by_label[label]):
                quota[label] += 1
    while sum(quota.values()) > n:  # the minimum of one took from the others: the largest give back
        label = max((k for k in quota if quota[k] > 1), key=lambda k: (quota[k] - exact[k], quota[k], -k))
        quota[label] -= 1
    chosen: list[int] = []
    for label in sorted(by_label):
        idx = list(by_label[label])
        rng.shuffle(idx)
        chosen += idx[: quota[label]]
    return sorted(chosen)


def majority_baseline(task: TaskData, langs: list[str], split: str = "test") -> dict[str, dict[str, float]]:
    """Per language, every metric of the task (``task.metrics``) on its ``split`` set (test, or dev) for always
    predicting the most frequent label of the English training examples step 3 uses (``train_records``), and under
    ``chance/{metric}`` the best input-blind predictor's score in each scalar metric (``chance_scores``); {} for
    QA."""
    if task.is_qa:
        return {}
    train = [int(r["label"]) for r in task.train_records()]
    out = {}
    for lang in langs:
        test = [int(r["label"]) for r in task.records(split, lang)]
        scores = majority_scores(train, test, task.labels, task.metrics)
        scores.update({f"{CHANCE}{m}": v for m, v in chance_scores(train, test, task.labels, task.metrics).items()})
        out[lang] = scores
    return out

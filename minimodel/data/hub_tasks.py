"""The cross-lingual tasks on the Hugging Face hub (``TASKS``) and their splits, read from the hub or from a local copy.

Cross-lingual zero-shot transfer: a model is finetuned on the English training data of a task
(``TaskSpec.train_task``, split ``train``, language ``en``) and evaluated on ``TaskSpec.eval_split``
of the other languages. Records are plain dicts in the hub schema of each dataset.

Local copies use the same schema, in a directory holding ``{split}.{lang}.{ext}`` or
``{lang}/{split}.{ext}`` with ext one of jsonl, json, parquet, csv, tsv. A ``.json`` file is a list
of records, ``{"data": [records]}``, or the nested SQuAD layout of the official MLQA / XQuAD / SQuAD
downloads (``data -> paragraphs -> qas``). In CSV/TSV files, QA ``answers`` is a JSON string.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minimodel.data.task_files import TaskFileNotFoundError, find_split_file, json_object, read_records
from minimodel.errors import TaskDataError


@dataclass(frozen=True)
class TaskSpec:
    """A cross-lingual task on the Hugging Face hub."""

    name: str
    hub_id: str
    config_template: str | None  # formatted with ``lang``; None: the dataset's default config
    languages: tuple[str, ...]
    splits: tuple[str, ...]
    eval_split: str
    train_task: str  # the task whose English ``train`` split finetunes the model
    text_fields: tuple[str, ...]  # classification inputs; ("question", "context") for QA
    labels: tuple[str, ...] = ()  # class names by label id; empty for QA

    @property
    def is_qa(self) -> bool:
        return not self.labels

    def config(self, lang: str) -> str | None:
        """The hub config name of ``lang``."""
        return None if self.config_template is None else self.config_template.format(lang=lang)


_QA_FIELDS = ("question", "context")
TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("xnli", "facebook/xnli", "{lang}",
                 ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur", "vi", "zh"),
                 ("train", "validation", "test"), "test", "xnli", ("premise", "hypothesis"),
                 ("entailment", "neutral", "contradiction")),
        TaskSpec("pawsx", "google-research-datasets/paws-x", "{lang}", ("de", "en", "es", "fr", "ja", "ko", "zh"),
                 ("train", "validation", "test"), "test", "pawsx", ("sentence1", "sentence2"), ("0", "1")),
        TaskSpec("mlqa", "facebook/mlqa", "mlqa.{lang}.{lang}", ("ar", "de", "en", "es", "hi", "vi", "zh"),
                 ("validation", "test"), "test", "squad", _QA_FIELDS),
        TaskSpec("xquad", "google/xquad", "xquad.{lang}",
                 ("ar", "de", "el", "en", "es", "hi", "ro", "ru", "th", "tr", "vi", "zh"),
                 ("validation",), "validation", "squad", _QA_FIELDS),
        TaskSpec("squad", "rajpurkar/squad", None, ("en",), ("train", "validation"), "validation", "squad",
                 _QA_FIELDS),
    )
}


def get_task(name: str) -> TaskSpec:
    if name not in TASKS:
        raise TaskDataError(f"unknown task '{name}' (known: {', '.join(TASKS)})")
    return TASKS[name]

def load_task_split(task: str, lang: str, split: str, source: str | Path | None = None,
                    id_field: str = "") -> list[dict[str, Any]]:
    """The records of ``split`` of ``task`` in ``lang``: from the hub when ``source`` is None, else from
    the local directory (or file) ``source`` in the hub schema (checked, with the file and line named).
    ``id_field`` (a classification task's id column, ``tasks.X.id_field``): every record must have it, and its
    value becomes the record's ``id``."""
    spec = get_task(task)
    if split not in spec.splits:
        raise TaskDataError(f"{task} has no split '{split}' (splits: {', '.join(spec.splits)})")
    if source is None:
        if lang not in spec.languages:
            raise TaskDataError(f"{task} has no language '{lang}' on the hub (languages: {', '.join(spec.languages)})")
        import datasets

        rows = datasets.load_dataset(spec.hub_id, spec.config(lang), split=split).to_list()
        return [_with_id(rec, task, id_field, f"{spec.hub_id} ({lang}, {split}), row {n}")
                for n, rec in enumerate(rows, 1)]
    path = Path(source)
    if path.is_dir():
        path = find_split_file(path, split, lang)
    elif not path.is_file():
        raise TaskFileNotFoundError(f"{task} data not found: {path} is neither a file nor a directory")
    records = [_with_id(_check_record(spec, rec, f"{path}, {where}"), task, id_field, f"{path}, {where}")
               for where, rec in read_records(path)]
    if not records:
        raise TaskDataError(f"{path}: no records")
    return records


def _check_record(spec: TaskSpec, rec: dict[str, Any], where: str) -> dict[str, Any]:
    """``rec`` checked against the hub schema of ``spec``; CSV strings become int labels / answer dicts."""
    required = (*spec.text_fields, "id", "answers") if spec.is_qa else (*spec.text_fields, "label")
    for field in required:
        if rec.get(field) is None:
            raise TaskDataError(f"{where}: missing field '{field}'")
    rec = dict(rec)
    if spec.is_qa:
        answers = json_object(rec["answers"], where) if isinstance(rec["answers"], str) else rec["answers"]
        if not (
            isinstance(answers, dict)
            and isinstance(answers.get("text"), list)
            and isinstance(answers.get("answer_start"), list)
            and len(answers["text"]) == len(answers["answer_start"])
        ):
            raise TaskDataError(f"{where}: answers must be {{\"text\": [...], \"answer_start\": [...]}} of equal length")
        if not all(str(start).isdecimal() for start in answers["answer_start"]):
            raise TaskDataError(f"{where}: answer_start must hold character offsets (integers), got "
                                f"{answers['answer_start']!r}")
        rec["answers"] = {"text": answers["text"], "answer_start": [int(s) for s in answers["answer_start"]]}
    else:
        label = str(rec["label"])
        if not label.isdecimal() or int(label) >= len(spec.labels):
            raise TaskDataError(f"{where}: label {rec['label']!r} is not a label id 0..{len(spec.labels) - 1}")
        rec["label"] = int(label)
    return rec


def _with_id(rec: dict[str, Any], task: str, id_field: str, where: str) -> dict[str, Any]:
    """``rec`` with ``id`` set to its ``id_field`` value (``rec`` itself without an ``id_field``)."""
    if not id_field:
        return rec
    if rec.get(id_field) is None:
        found = [k for k in rec if k is not None]
        raise TaskDataError(f"{where}: missing field '{id_field}' (tasks.{task}.id_field names it as the id column: "
                            f"set it to one of the file's columns {found}, or leave it unset to use the 'id' "
                            f"column or the record's position)")
    return {**rec, "id": rec[id_field]}

"""Downstream tasks: loading (Hugging Face hub or local files), featurisation and QA span decoding.

Cross-lingual zero-shot transfer: a model is finetuned on the English training data of a task
(``TaskSpec.train_task``, split ``train``, language ``en``) and evaluated on ``TaskSpec.eval_split``
of the other languages. Records are plain dicts in the hub schema of each dataset.

Local copies use the same schema, in a directory holding ``{split}.{lang}.{ext}`` or
``{lang}/{split}.{ext}`` with ext one of jsonl, json, parquet, csv, tsv. A ``.json`` file is a list
of records, ``{"data": [records]}``, or the nested SQuAD layout of the official MLQA / XQuAD / SQuAD
downloads (``data -> paragraphs -> qas``). In CSV/TSV files, QA ``answers`` is a JSON string.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minimodel.config.schema import TaskConfig
from minimodel.data.tokenizer import PAD, AnyTokenizer
from minimodel.errors import TaskDataError
from minimodel.task_metrics import majority_scores, metrics_of

if TYPE_CHECKING:  # torch is imported where tensors are made, so that reading tasks (the report) stays light
    import torch

EXTENSIONS = ("jsonl", "json", "parquet", "csv", "tsv")
Offset = tuple[int, int] | None


class TaskFileNotFoundError(TaskDataError, FileNotFoundError):
    """A task directory or split file that does not exist."""


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


# ----------------------------------------------------------------------------------------- loading


def load_task_split(task: str, lang: str, split: str, source: str | Path | None = None) -> list[dict[str, Any]]:
    """The records of ``split`` of ``task`` in ``lang``: from the hub when ``source`` is None, else from
    the local directory (or file) ``source`` in the hub schema (checked, with the file and line named)."""
    spec = get_task(task)
    if split not in spec.splits:
        raise TaskDataError(f"{task} has no split '{split}' (splits: {', '.join(spec.splits)})")
    if source is None:
        if lang not in spec.languages:
            raise TaskDataError(f"{task} has no language '{lang}' on the hub (languages: {', '.join(spec.languages)})")
        import datasets

        return datasets.load_dataset(spec.hub_id, spec.config(lang), split=split).to_list()
    path = Path(source)
    if path.is_dir():
        path = find_split_file(path, split, lang)
    elif not path.is_file():
        raise TaskFileNotFoundError(f"{task} data not found: {path} is neither a file nor a directory")
    records = [_check_record(spec, rec, f"{path}, {where}") for where, rec in read_records(path)]
    if not records:
        raise TaskDataError(f"{path}: no records")
    return records


def find_split_file(root: Path, split: str, lang: str | None) -> Path:
    """``root/{split}.{lang}.{ext}`` or ``root/{lang}/{split}.{ext}`` (``root/{split}.{ext}`` when
    ``lang`` is None), trying the extensions in the order of ``EXTENSIONS``."""
    stems = [split] if lang is None else [f"{split}.{lang}", f"{lang}/{split}"]
    for stem in stems:
        for ext in EXTENSIONS:
            if (root / f"{stem}.{ext}").is_file():
                return root / f"{stem}.{ext}"
    patterns = " or ".join(f"{stem}.{{{','.join(EXTENSIONS)}}}" for stem in stems)
    raise TaskFileNotFoundError(
        f"no {split} split{'' if lang is None else f' for {lang}'} in {root}: expected {patterns}")


def has_split(root: Path, split: str, lang: str | None) -> bool:
    """Whether ``find_split_file`` finds a file."""
    try:
        find_split_file(root, split, lang)
    except TaskFileNotFoundError:
        return False
    return True


def read_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(location, record)`` for each record of a jsonl/json/parquet/csv/tsv file; the location
    ("line 3", "record 2", "question q7") is for error messages. Text files are UTF-8 (a BOM is ignored)."""
    try:
        yield from _read_records(path)
    except UnicodeDecodeError as e:
        raise _not_utf8(path) from e


def _not_utf8(path: Path) -> TaskDataError:
    """The error for a text file that is not UTF-8, naming the line of its first bad byte."""
    raw = path.read_bytes()
    try:
        raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        return TaskDataError(f"{path}, line {line}: not UTF-8 (byte 0x{raw[e.start]:02x}); the expected encoding "
                             f"is UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8)")
    return TaskDataError(f"{path}: not UTF-8; the expected encoding is UTF-8")


def _read_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    ext = path.suffix.lstrip(".")
    if ext == "jsonl":
        with open(path, encoding="utf-8-sig") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    yield f"line {n}", _json_object(line, f"{path}, line {n}")
    elif ext == "json":
        yield from _json_records(path)
    elif ext in ("csv", "tsv"):
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t" if ext == "tsv" else ",")
            try:
                header = reader.fieldnames or []  # (reads the header: line_num is its last line)
                _check_columns(path, f"line {reader.line_num}: the header", header)
                for row in reader:
                    yield f"line {reader.line_num}", row
            except csv.Error as e:
                raise TaskDataError(f"{path}, line {reader.line_num}: not readable as {ext.upper()} ({e})") from e
    elif ext == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as e:
            raise TaskDataError(f"{path}: not a readable Parquet file ({e})") from e
        for n, rec in enumerate(table.to_pylist(), 1):
            yield f"row {n}", rec
    else:
        raise TaskDataError(f"{path}: unsupported file type '.{ext}' (use one of: {', '.join(EXTENSIONS)})")


def _check_columns(path: Path, where: str, names: Sequence[str]) -> None:
    """A table whose columns repeat a name would be read with only one of them (the last): refused."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise TaskDataError(f"{path}, {where}: column {name!r} appears more than once ({list(names)}); a reader "
                                f"would keep only one of them: rename or remove the extra column")
        seen.add(name)


class _DuplicateKey(ValueError):
    def __init__(self, key: str, obj: dict[str, Any]) -> None:
        super().__init__(key)
        self.key, self.obj = key, obj


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object hook: an object that repeats a key (JSON keeps the last silently) is refused."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key, obj)
            seen.add(key)
    return obj


def _duplicate_key(where: str, e: _DuplicateKey) -> TaskDataError:
    return TaskDataError(f"{where}: key {e.key!r} appears more than once in one JSON object (keys: {list(e.obj)}); "
                         f"JSON readers keep only the last: rename or remove the extra one")


def _json_object(text: str, where: str) -> dict[str, Any]:
    try:
        rec = json.loads(text, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise TaskDataError(f"{where}: invalid JSON ({e.msg})") from e
    except _DuplicateKey as e:
        raise _duplicate_key(where, e) from e
    if not isinstance(rec, dict):
        raise TaskDataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    return rec


def _json_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Records of a .json file: a list, ``{"data": list}``, or nested SQuAD (flattened to the hub schema)."""
    try:
        text = path.read_text(encoding="utf-8-sig")
        data = json.loads(text, object_pairs_hook=_unique_keys) if text.strip() else []
    except json.JSONDecodeError as e:
        raise TaskDataError(f"{path}, line {e.lineno}: invalid JSON ({e.msg})") from e
    except _DuplicateKey as e:
        raise _duplicate_key(str(path), e) from e
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise TaskDataError(f"{path}: expected a list of records or {{\"data\": [...]}}")
    for n, rec in enumerate(data, 1):
        if not isinstance(rec, dict):
            raise TaskDataError(f"{path}, record {n}: expected a JSON object, got {type(rec).__name__}")
        if "paragraphs" not in rec:
            yield f"record {n}", rec
            continue
        try:
            questions = [(para, q) for para in rec["paragraphs"] for q in para["qas"]]
            flat = [(f"question {q['id']}", {
                "id": q["id"], "title": rec.get("title", ""), "context": para["context"], "question": q["question"],
                "answers": {"text": [a["text"] for a in q["answers"]],
                            "answer_start": [a["answer_start"] for a in q["answers"]]}}) for para, q in questions]
        except (KeyError, TypeError) as e:  # only the user's data is indexed here
            problem = f"missing key {e}" if isinstance(e, KeyError) else str(e)
            raise TaskDataError(
                f"{path}, record {n}: not in the SQuAD layout (paragraphs: [{{context, qas: [{{id, question, "
                f"answers: [{{text, answer_start}}]}}]}}]): {problem}") from e
        yield from flat


def _check_record(spec: TaskSpec, rec: dict[str, Any], where: str) -> dict[str, Any]:
    """``rec`` checked against the hub schema of ``spec``; CSV strings become int labels / answer dicts."""
    required = (*spec.text_fields, "id", "answers") if spec.is_qa else (*spec.text_fields, "label")
    for field in required:
        if rec.get(field) is None:
            raise TaskDataError(f"{where}: missing field '{field}'")
    rec = dict(rec)
    if spec.is_qa:
        answers = _json_object(rec["answers"], where) if isinstance(rec["answers"], str) else rec["answers"]
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


class LocalClassificationTask:
    """A user-defined classification task in ``root``: ``train``/``dev`` files (``train.jsonl``) and
    per-language test files (``test.{lang}.jsonl``), as JSONL, CSV or TSV (also json/parquet), each
    record holding ``text_fields`` (one text, or two for pairs) and ``label_field`` (string or int).

    Labels are kept as strings; the label set is ``labels`` or the sorted labels of the train split
    (numerically when all are integers), and label ids index it. ``name`` is the task's key under
    ``tasks:`` in the config, for error messages ("" when not made from a config); ``labels_source`` says
    where given ``labels`` come from ("the model was finetuned on"), for the message about an unknown label.
    """

    def __init__(
        self,
        root: str | Path,
        text_fields: Sequence[str] = ("text",),
        label_field: str = "label",
        labels: Sequence[str] | None = None,
        name: str = "",
        labels_source: str = "",
    ) -> None:
        self.name = name
        if len(text_fields) not in (1, 2):
            raise TaskDataError(f"{self._key('text_fields')} must name one or two fields, got {list(text_fields)}")
        self.root = Path(root)
        if not self.root.is_dir():
            raise TaskFileNotFoundError(f"task directory not found: {self.root}"
                                        + (f" (set {self._key('source')})" if name else ""))
        self.text_fields = tuple(text_fields)
        self.label_field = label_field
        self.labels_source = labels_source
        self.labels = tuple(str(label) for label in labels) if labels is not None else self._infer_labels()

    def _key(self, key: str) -> str:
        """``tasks.NAME.key`` (just ``key`` without a name)."""
        return f"tasks.{self.name}.{key}" if self.name else key

    def _infer_labels(self) -> tuple[str, ...]:
        found = {str(rec[self.label_field]) for _, rec in self._read("train", None)}
        if all(label.lstrip("-").isdecimal() for label in found):
            return tuple(sorted(found, key=int))
        return tuple(sorted(found))

    def _read(self, split: str, lang: str | None) -> list[tuple[str, dict[str, Any]]]:
        """Records with their file and location, all fields present (labels not yet checked); at least one."""
        try:
            path = find_split_file(self.root, split, lang)
        except TaskFileNotFoundError as e:
            if not (self.name and lang):
                raise
            raise TaskFileNotFoundError(f"{e} (add the file, or leave {lang} out of {self._key('langs')})") from e
        out = []
        for where, rec in read_records(path):
            for field in (*self.text_fields, self.label_field):
                if rec.get(field) is None:
                    raise TaskDataError(f"{path}, {where}: missing field '{field}'{self._fields_hint(field, rec)}")
            out.append((f"{path}, {where}", rec))
        if not out:
            raise TaskDataError(f"{path}: no records")
        return out

    def _fields_hint(self, field: str, rec: dict[str, Any]) -> str:
        """Which config key names the missing ``field``, and the fields the record has ("" without a name)."""
        if not self.name:
            return ""
        key = self._key("label_field" if field == self.label_field else "text_fields")
        return f" (set {key} to the file's columns: found {[k for k in rec if k is not None]})"

    def load(self, split: str, lang: str | None = None) -> list[dict[str, Any]]:
        """Records of ``split`` (``test`` with ``lang``): ``id`` (if present), the text fields and
        ``label`` as a label id."""
        label_ids = {label: i for i, label in enumerate(self.labels)}
        out = []
        for where, rec in self._read(split, lang):
            label = str(rec[self.label_field])
            if label not in label_ids:
                known = f"one of the labels {self.labels_source}," if self.labels_source else "in the label set"
                raise TaskDataError(f"{where}: label '{label}' is not {known} {list(self.labels)}")
            ids = {"id": rec["id"]} if "id" in rec else {}
            out.append({**ids, **{f: str(rec[f]) for f in self.text_fields}, "label": label_ids[label]})
        return out


# ----------------------------------------------------------------------------------- featurisation


def encode_with_offsets(tokenizer: AnyTokenizer, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``text`` and each token's ``(start, end)`` character span in ``text``, without the
    leading whitespace a piece may carry (a bare "▁" gets an empty span)."""
    return tokenizer.encode_with_offsets(text)


def encode_classification(
    records: Sequence[dict[str, Any]], tokenizer: AnyTokenizer, text_fields: Sequence[str], max_len: int = 256
) -> dict[str, list]:
    """RoBERTa inputs ``<s> A </s>`` or ``<s> A </s></s> B </s>``, at most ``max_len`` tokens (the longer
    text loses its last token first), and the records' int labels."""
    if len(text_fields) not in (1, 2):
        raise ValueError(f"text_fields must name one or two fields, got {list(text_fields)}")
    specials = 2 if len(text_fields) == 1 else 4
    if max_len <= specials:
        raise ValueError(f"max_len={max_len} leaves no room for text")
    columns = [tokenizer.encode([str(r[f]) for r in records]) for f in text_fields]
    bos, eos = tokenizer.specials.bos, tokenizer.specials.eos
    input_ids = []
    for ids in zip(*columns):
        if len(ids) == 1:
            input_ids.append([bos, *ids[0][: max_len - specials], eos])
        else:
            len_a, len_b = truncate_pair(len(ids[0]), len(ids[1]), max_len - specials)
            input_ids.append([bos, *ids[0][:len_a], eos, eos, *ids[1][:len_b], eos])
    return {"input_ids": input_ids, "label": [int(r["label"]) for r in records]}


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


@dataclass
class TaskData:
    """Splits and featurisation of one task."""

    name: str
    cfg: TaskConfig
    saved_labels: tuple[str, ...] | None = None  # the labels a finetuned model was trained with (evaluation)

    def __post_init__(self) -> None:
        self.local = LocalClassificationTask(
            self.cfg.source, self.cfg.text_fields, self.cfg.label_field, self.saved_labels, name=self.name,
            labels_source="" if self.saved_labels is None else "the model was finetuned on",
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
        if path is None:
            return ""
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

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
            return load_task_split(task, "en", hub_split, source)
        return load_task_split(self.name, lang, spec.eval_split, self.cfg.source or None)

    def features(self, records: list[dict[str, Any]], tokenizer: AnyTokenizer) -> list[dict[str, Any]]:
        if self.is_qa:
            return feature_rows(encode_qa(records, tokenizer, self.cfg.max_len, self.cfg.stride))
        return feature_rows(encode_classification(records, tokenizer, self.text_fields, self.cfg.max_len))


def majority_baseline(task: TaskData, langs: list[str], split: str = "test") -> dict[str, dict[str, float]]:
    """Per language, every metric of the task (``task.metrics``) on its ``split`` set (test, or dev) for always
    predicting the most frequent label of the English training data; {} for QA."""
    if task.is_qa:
        return {}
    train = [int(r["label"]) for r in task.records("train")]
    return {lang: majority_scores(train, [int(r["label"]) for r in task.records(split, lang)], task.labels,
                                  task.metrics)
            for lang in langs}

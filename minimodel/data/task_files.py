"""Reading task files: the files of a task directory (``find_split_file``), their records in any of the supported
formats (``read_records``: jsonl, json, parquet, csv, tsv; UTF-8; a repeated key or column is refused), and the
user-defined classification tasks made of them (``LocalClassificationTask``)."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from minimodel.errors import TaskDataError
from minimodel.store import atomic

EXTENSIONS = ("jsonl", "json", "parquet", "csv", "tsv")


class TaskFileNotFoundError(TaskDataError, FileNotFoundError):
    """A task directory or split file that does not exist."""


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
                    yield f"line {n}", json_object(line, f"{path}, line {n}")
    elif ext == "json":
        yield from _json_records(path)
    elif ext in ("csv", "tsv"):
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t" if ext == "tsv" else ",")
            try:
                header = reader.fieldnames or []  # (reads the header: line_num is its last line)
                _check_columns(path, f"line {reader.line_num}: the header", header)
                for row in reader:
                    if None in row:  # DictReader's restkey: more fields than the header names
                        sep = "tab" if ext == "tsv" else "comma"
                        raise TaskDataError(
                            f"{path}, line {reader.line_num}: {len(header) + len(row[None])} fields where the header "
                            f"has {len(header)}: a {sep} inside a text that is not quoted? Quote that field "
                            f"(\"...\") or remove the extra {sep}s")
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


def json_object(text: str, where: str) -> dict[str, Any]:
    """``text`` as one JSON object (its keys unique); TaskDataError naming ``where`` otherwise."""
    try:
        rec = atomic.loads(text, object_pairs_hook=_unique_keys)
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
        data = atomic.loads(text, object_pairs_hook=_unique_keys) if text.strip() else []
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


class LocalClassificationTask:
    """A user-defined classification task in ``root``: ``train``/``dev`` files (``train.jsonl``) and
    per-language test files (``test.{lang}.jsonl``), as JSONL, CSV or TSV (also json/parquet), each
    record holding ``text_fields`` (one text, or two for pairs) and ``label_field`` (string or int), and
    ``id_field`` when one is named (every record of every file read must have it).

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
        id_field: str = "",
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
        self.id_field = id_field
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
            for field in (*self.text_fields, self.label_field, *([self.id_field] if self.id_field else [])):
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
        found = [k for k in rec if k is not None]
        if field == self.id_field and field not in (*self.text_fields, self.label_field):
            return (f" ({self._key('id_field')} names it as the id column: set it to one of the file's columns "
                    f"{found}, or leave it unset to use the 'id' column or the record's position)")
        key = self._key("label_field" if field == self.label_field else "text_fields")
        return f" (set {key} to the file's columns: found {found})"

    def load(self, split: str, lang: str | None = None) -> list[dict[str, Any]]:
        """Records of ``split`` (``test`` with ``lang``): ``id`` (the ``id_field`` column's value; without one, the
        ``id`` column's where the record has it), the text fields and ``label`` as a label id."""
        label_ids = {label: i for i, label in enumerate(self.labels)}
        out = []
        for where, rec in self._read(split, lang):
            label = str(rec[self.label_field])
            if label not in label_ids:
                known = f"one of the labels {self.labels_source}," if self.labels_source else "in the label set"
                raise TaskDataError(f"{where}: label '{label}' is not {known} {list(self.labels)}")
            id_field = self.id_field or "id"
            ids = {"id": rec[id_field]} if rec.get(id_field) is not None else {}
            out.append({**ids, **{f: str(rec[f]) for f in self.text_fields}, "label": label_ids[label]})
        return out

"""Bad data files: task files (empty, missing, not UTF-8, BOM, wrong columns) and corpora (binary, one huge
line, Latin-1 bytes, a vocabulary SentencePiece cannot make, an unwritable prepared directory). Each is a
``UserError`` whose message names the file and the fix; nothing is written on failure."""

from __future__ import annotations

import json
import logging
import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from minimodel.cli import main
from minimodel.config.schema import TaskConfig
from minimodel.data.corpus import CorpusError, iter_documents
from minimodel.data.hub_tasks import load_task_split
from minimodel.data.prepare import prepare_language
from minimodel.data.shards import ShardError
from minimodel.data.spm_sample import MAX_SENTENCE_BYTES
from minimodel.data.spm_training import train_tokenizer
from minimodel.data.task_files import LocalClassificationTask
from minimodel.data.tasks import TaskData
from minimodel.data.tokenizer import TokenizerError
from minimodel.errors import TaskDataError, UserError
from tests.conftest import ROOT, real_text, tiny_config

ROWS = [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return path


def local_task(root: Path, name: str = "sentiment", **cfg: object) -> TaskData:
    return TaskData(name, TaskConfig(kind="local", source=str(root), **cfg))  # type: ignore[arg-type]


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Warnings of the ``minimodel`` logger (which stops propagating once the CLI has set it up)."""
    logger = logging.getLogger("minimodel")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="minimodel")
    yield caplog
    logger.removeHandler(caplog.handler)


# ------------------------------------------------------------------------------------------ tasks


def test_an_empty_test_or_train_file_is_named_at_load(tmp_path: Path) -> None:
    jsonl(tmp_path / "train.jsonl", ROWS)
    empty = tmp_path / "test.de.jsonl"
    empty.write_text("\n", "utf-8")
    task = local_task(tmp_path)
    with pytest.raises(TaskDataError) as e:
        task.records("test", "de")
    assert str(e.value) == f"{empty}: no records"
    header_only = tmp_path / "test.fr.csv"
    header_only.write_text("text,label\n", "utf-8")
    with pytest.raises(TaskDataError, match=f"^{header_only}: no records$"):
        task.records("test", "fr")
    (tmp_path / "train.jsonl").write_text("", "utf-8")
    with pytest.raises(TaskDataError, match=f"^{tmp_path / 'train.jsonl'}: no records$"):
        local_task(tmp_path)
    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "test.de.json").write_text("", "utf-8")
    with pytest.raises(TaskDataError, match=f"^{hub / 'test.de.json'}: no records$"):
        load_task_split("xnli", "de", "test", hub)


def test_a_missing_test_file_is_a_user_error(tmp_path: Path) -> None:
    jsonl(tmp_path / "train.jsonl", ROWS)
    task = local_task(tmp_path, langs=["fr"])
    with pytest.raises(TaskDataError) as e:
        task.records("test", "fr")
    assert isinstance(e.value, UserError) and isinstance(e.value, FileNotFoundError)
    assert str(e.value) == (f"no test split for fr in {tmp_path}: expected test.fr.{{jsonl,json,parquet,csv,tsv}} "
                            f"or fr/test.{{jsonl,json,parquet,csv,tsv}} (add the file, or leave fr out of "
                            f"tasks.sentiment.langs)")
    with pytest.raises(TaskDataError, match=f"task directory not found: {tmp_path / 'nope'} "
                                            r"\(set tasks.sentiment.source\)"):
        local_task(tmp_path / "nope")


def test_languages_of_a_local_task_in_either_layout(tmp_path: Path) -> None:
    jsonl(tmp_path / "train.jsonl", ROWS)
    jsonl(tmp_path / "test.de.jsonl", ROWS)
    (tmp_path / "tr").mkdir()
    jsonl(tmp_path / "tr" / "test.jsonl", ROWS)
    task = local_task(tmp_path)
    assert task.languages(["de", "fr", "tr"]) == ["de", "tr"]
    assert [r["label"] for r in task.records("test", "tr")] == [1, 0]


@pytest.mark.parametrize("ext", ["jsonl", "json", "csv", "tsv"])
def test_a_task_file_that_is_not_utf8(tmp_path: Path, ext: str) -> None:
    jsonl(tmp_path / "train.jsonl", ROWS)
    text = {"jsonl": '{"text": "good", "label": "pos"}\n{"text": "caf\xe9", "label": "pos"}\n',
            "json": '[{"text": "good", "label": "pos"},\n {"text": "caf\xe9", "label": "pos"}]',
            "csv": "text,label\ngood,pos\ncaf\xe9,pos\n", "tsv": "text\tlabel\ngood\tpos\ncaf\xe9\tpos\n"}[ext]
    bad = tmp_path / f"test.de.{ext}"
    bad.write_bytes(text.encode("latin-1"))
    with pytest.raises(TaskDataError) as e:
        local_task(tmp_path).records("test", "de")
    line = 2 if ext in ("jsonl", "json") else 3
    assert str(e.value) == (f"{bad}, line {line}: not UTF-8 (byte 0xe9); the expected encoding is UTF-8: convert "
                            f"the file (e.g. iconv -f latin1 -t utf-8)")


@pytest.mark.parametrize("ext", ["jsonl", "json", "csv", "tsv"])
def test_a_byte_order_mark_is_ignored(tmp_path: Path, ext: str) -> None:
    text = {"jsonl": '{"text": "good", "label": "pos"}\n{"text": "bad", "label": "neg"}\n',
            "json": json.dumps(ROWS), "csv": "text,label\ngood,pos\nbad,neg\n",
            "tsv": "text\tlabel\ngood\tpos\nbad\tneg\n"}[ext]
    (tmp_path / f"train.{ext}").write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    task = local_task(tmp_path)
    assert task.labels == ("neg", "pos")
    assert task.records("train") == [{"text": "good", "label": 1}, {"text": "bad", "label": 0}]


def test_a_missing_column_names_the_config_key(tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\ngood,pos\n", "utf-8")
    with pytest.raises(TaskDataError) as e:
        local_task(tmp_path)
    assert str(e.value) == (f"{train}, line 2: missing field 'text' (set tasks.sentiment.text_fields to the file's "
                            f"columns: found ['sentence', 'label'])")
    assert local_task(tmp_path, text_fields=["sentence"]).labels == ("pos",)
    train.write_text("text,polarity\ngood,pos\n", "utf-8")
    with pytest.raises(TaskDataError) as e:
        local_task(tmp_path)
    assert str(e.value) == (f"{train}, line 2: missing field 'label' (set tasks.sentiment.label_field to the "
                            f"file's columns: found ['text', 'polarity'])")
    with pytest.raises(TaskDataError, match="tasks.sentiment.text_fields must name one or two fields"):
        local_task(tmp_path, text_fields=["a", "b", "c"])


def test_malformed_task_files_are_user_errors(tmp_path: Path) -> None:
    squad = tmp_path / "test.de.json"
    squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": "c"}]}]}), "utf-8")
    with pytest.raises(TaskDataError, match=rf"^{squad}, record 1: not in the SQuAD layout .*: missing key 'qas'$"):
        load_task_split("mlqa", "de", "test", tmp_path)
    squad.write_text('{"data": [\n{"id": 1,\n', "utf-8")
    with pytest.raises(TaskDataError, match=rf"^{squad}, line 3: invalid JSON"):
        load_task_split("mlqa", "de", "test", tmp_path)
    squad.unlink()
    parquet = tmp_path / "test.de.parquet"
    parquet.write_bytes(b"not parquet")
    with pytest.raises(TaskDataError, match=rf"^{parquet}: not a readable Parquet file"):
        load_task_split("mlqa", "de", "test", tmp_path)
    with pytest.raises(TaskDataError, match="unknown task 'nli'"):
        load_task_split("nli", "de", "test", tmp_path)
    with pytest.raises(TaskDataError, match="xquad has no split 'test'"):
        load_task_split("xquad", "de", "test", tmp_path)
    jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(TaskDataError, match=rf"^{tmp_path / 'train.jsonl'}, line 2: label 'neg' is not in the "):
        LocalClassificationTask(tmp_path, labels=["pos"]).load("train")


# ----------------------------------------------------------------------------------------- corpora


def corpus(tmp_path: Path, data: bytes, lang: str = "en") -> Path:
    d = tmp_path / "corpus"
    d.mkdir(exist_ok=True)
    (d / f"{lang}.txt").write_bytes(data)
    return d


def test_a_binary_corpus_is_not_text(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    d = corpus(tmp_path, random.Random(0).randbytes(300_000))
    rc = main(["prepare", str(ROOT / "experiments" / "tiny.yaml"), f"data.corpus_dir={d}",
               f"data.prepared_dir={tmp_path / 'p'}", "data.vocab_size=1000", "--langs=en", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert (f"[minimodel] prepare: error: corpus {d / 'en.txt'} is not text: 57% of its first 284,") in err
    assert ("characters are NUL/control bytes or invalid UTF-8; a corpus is UTF-8 text, one sentence or paragraph "
            "per line") in err
    assert "vocab_size" not in err
    assert not (tmp_path / "p").exists()
    with pytest.raises(CorpusError, match="is not text"):  # UTF-16 is not UTF-8 text either
        prepare_language(tiny_config(tmp_path, corpus(tmp_path, real_text("de", 50_000).encode("utf-16"), "de")),
                         "de", progress=False)


def test_a_vocabulary_below_what_sentencepiece_needs_says_the_minimum(tmp_path: Path) -> None:
    text = tmp_path / "en.txt"
    text.write_text(real_text("en", 100_000), "utf-8")
    with pytest.raises(TokenizerError) as e:
        train_tokenizer(text, tmp_path / "spm.model", 10)
    minimum = int(str(e.value).split("is below the ")[1].split()[0])
    assert str(e.value) == (f"data.vocab_size=10 is below the {minimum} pieces SentencePiece needs for {text} (the 5 "
                            f"special pieces and one per character covering data.spm_character_coverage of the "
                            f"text): set data.vocab_size to at least {minimum}")
    assert "lower data.vocab_size" not in str(e.value) and not (tmp_path / "spm.model").exists()
    assert train_tokenizer(text, tmp_path / "spm.model", minimum).vocab_size == minimum  # the minimum is true


def test_a_corpus_too_small_for_the_vocabulary_says_lower_it(tmp_path: Path) -> None:
    small = tmp_path / "small.txt"
    small.write_text("a tiny corpus\n\nwith two documents\n", "utf-8")
    with pytest.raises(TokenizerError) as e:
        train_tokenizer(small, tmp_path / "spm.model", 5000)
    most = re.fullmatch(rf"corpus {small} is too small for a vocabulary of 5000 pieces \(SentencePiece finds at "
                        rf"most (\d+) in it\): lower data.vocab_size to at most \1, or use a larger corpus", str(e.value))
    assert most is not None
    assert train_tokenizer(small, tmp_path / "spm.model", int(most[1])).vocab_size == int(most[1])


def test_lines_over_sentencepieces_limit(tmp_path: Path, warnings: pytest.LogCaptureFixture) -> None:
    huge = tmp_path / "huge.txt"
    huge.write_text(("word " * 4_000_000).strip() + "\n", "utf-8")  # one 20 MB line
    with pytest.raises(CorpusError) as e:
        train_tokenizer(huge, tmp_path / "spm.model", 100)
    assert str(e.value) == (f"corpus {huge} has no line to train the tokenizer on: SentencePiece skips lines over "
                            f"65,536 bytes (its max_sentence_length) and every line here (1) is longer; put one "
                            f"sentence or paragraph per line")
    mixed = tmp_path / "mixed.txt"
    long_line = "x" * (MAX_SENTENCE_BYTES + 1)
    mixed.write_text(f"{long_line}\n{real_text('en', 50_000)}\n{long_line}\n", "utf-8")
    assert train_tokenizer(mixed, tmp_path / "spm.model", 300).vocab_size == 300
    assert [r.getMessage() for r in warnings.records] == [
        f"corpus {mixed}: 2 line(s) over 65,536 bytes (SentencePiece's max_sentence_length) are skipped in "
        f"tokenizer training (they are still encoded); a corpus holds one sentence or paragraph per line"]


def test_latin1_bytes_in_a_corpus_are_reported_once(tmp_path: Path, warnings: pytest.LogCaptureFixture) -> None:
    lines = real_text("de", 20_000).encode("utf-8").split(b"\n")
    lines[7] = "Caf\xe9 cr\xe8me br\xfbl\xe9e".encode("latin-1")
    lines[12] = "na\xefve".encode("latin-1")
    path = tmp_path / "de.txt"
    path.write_bytes(b"\n".join(lines))
    docs = list(iter_documents(path))
    assert "Caf\ufffd cr\ufffdme br\ufffdl\ufffde" in [line for doc in docs for line in doc]
    assert list(iter_documents(path)) == docs  # a second pass (prepare reads twice) does not warn again
    assert [r.getMessage() for r in warnings.records] == [
        f"corpus {path} is not all UTF-8: 2 line(s) hold invalid bytes (5 invalid byte sequences replaced by "
        f"U+FFFD), the first at line 8; convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8) to keep those "
        f"characters"]
    assert all(r.levelno == logging.WARNING for r in warnings.records)


def test_an_unwritable_prepared_dir_fails_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer was trained before the prepared dir was checked")

    monkeypatch.setattr("minimodel.data.prepare.train_tokenizer", no_training)
    d = corpus(tmp_path, real_text("en", 20_000).encode("utf-8"))
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory is expected", "utf-8")
    cfg = tiny_config(tmp_path, d, f"data.prepared_dir={blocker / 'prepared'}")
    with pytest.raises(ShardError) as e:
        prepare_language(cfg, "en", progress=False)
    assert str(e.value) == (f"cannot write to {blocker / 'prepared' / 'en'} (Not a directory): the prepared data goes "
                            f"there; make it writable or set data.prepared_dir to a writable directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to a read-only directory")
def test_a_read_only_prepared_dir_fails_before_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_training(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tokenizer was trained before the prepared dir was checked")

    monkeypatch.setattr("minimodel.data.prepare.train_tokenizer", no_training)
    d = corpus(tmp_path, real_text("en", 20_000).encode("utf-8"))
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o555)
    try:
        with pytest.raises(ShardError, match=f"cannot write to {read_only / 'en'} \\(Permission denied\\)"):
            prepare_language(tiny_config(tmp_path, d, f"data.prepared_dir={read_only}"), "en", progress=False)
    finally:
        read_only.chmod(0o755)

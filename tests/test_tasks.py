"""Task loading (local fixtures in the hub schemas, and the hub call), featurisation and span decoding."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from torch.nn.functional import one_hot

from minimodel.data.hub_tasks import TASKS, get_task, load_task_split
from minimodel.data.spm_training import train_tokenizer
from minimodel.data.task_features import (
    decode_spans,
    encode_classification,
    encode_qa,
    encode_with_offsets,
    feature_rows,
    pad_collate,
    truncate_pair,
)
from minimodel.data.task_files import LocalClassificationTask
from minimodel.data.tokenizer import BOS, EOS, PAD, Tokenizer
from minimodel.metrics import squad_scores

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tasks"
HUB_FIELDS = {
    "xnli": {"premise", "hypothesis", "label"},
    "pawsx": {"id", "sentence1", "sentence2", "label"},
    "squad": {"id", "title", "context", "question", "answers"},
    "mlqa": {"id", "context", "question", "answers"},
    "xquad": {"id", "context", "question", "answers"},
}
FIXTURE_SPLITS = [  # (task, split, lang) of every fixture file
    (p.parent.name, *p.name.split(".")[:2]) for p in sorted(FIXTURES.glob("*/*.jsonl"))
]
QA_SPLITS = [s for s in FIXTURE_SPLITS if TASKS[s[0]].is_qa]


def load(task: str, split: str, lang: str) -> list[dict]:
    return load_task_split(task, lang, split, FIXTURES / task)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A 300-piece SentencePiece model trained on every text of the fixtures (en, de, zh)."""
    d = tmp_path_factory.mktemp("tok")
    texts = []
    for task, split, lang in FIXTURE_SPLITS:
        for rec in load(task, split, lang):
            texts += [v for k, v in rec.items() if isinstance(v, str) and k not in ("id", "title")]
    (d / "corpus.txt").write_text("\n".join(texts), encoding="utf-8")
    return train_tokenizer(d / "corpus.txt", d / "sp.model", vocab_size=300, character_coverage=1.0)


# --------------------------------------------------------------------------------------- loading


def test_registry() -> None:
    assert get_task("xnli").config("de") == "de"
    assert get_task("xnli").labels == ("entailment", "neutral", "contradiction")
    assert get_task("pawsx").hub_id == "google-research-datasets/paws-x"
    assert get_task("mlqa").config("zh") == "mlqa.zh.zh" and get_task("mlqa").eval_split == "test"
    assert get_task("xquad").config("de") == "xquad.de" and get_task("xquad").splits == ("validation",)
    assert get_task("squad").config("en") is None
    assert {t.name: t.train_task for t in TASKS.values()} == {
        "xnli": "xnli", "pawsx": "pawsx", "mlqa": "squad", "xquad": "squad", "squad": "squad"}
    with pytest.raises(ValueError, match="unknown task 'nli'"):
        get_task("nli")


@pytest.mark.parametrize(("task", "split", "lang"), FIXTURE_SPLITS)
def test_fixtures_load_in_hub_schema(task: str, split: str, lang: str) -> None:
    records = load(task, split, lang)
    assert records and all(set(r) == HUB_FIELDS[task] for r in records)
    for r in records:
        if TASKS[task].is_qa:
            for text, start in zip(r["answers"]["text"], r["answers"]["answer_start"], strict=True):
                assert r["context"][start : start + len(text)] == text
        else:
            assert r["label"] in range(len(TASKS[task].labels))


def test_local_formats_and_layouts(tmp_path: Path) -> None:
    want = load("xnli", "test", "de")
    (tmp_path / "de").mkdir()
    (tmp_path / "de" / "test.jsonl").write_text((FIXTURES / "xnli" / "test.de.jsonl").read_text("utf-8"), "utf-8")
    assert load_task_split("xnli", "de", "test", tmp_path) == want  # {lang}/{split}.jsonl
    for ext, delimiter in (("csv", ","), ("tsv", "\t")):
        with open(tmp_path / f"test.de.{ext}", "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["premise", "hypothesis", "label"], delimiter=delimiter)
            writer.writeheader()
            writer.writerows(want)
        assert load_task_split("xnli", "de", "test", tmp_path / f"test.de.{ext}") == want
    (tmp_path / "test.de.json").write_text(json.dumps(want), "utf-8")
    assert load_task_split("xnli", "de", "test", tmp_path / "test.de.json") == want
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(want), tmp_path / "test.de.parquet")
    assert load_task_split("xnli", "de", "test", tmp_path / "test.de.parquet") == want


def test_local_qa_formats(tmp_path: Path) -> None:
    want = load("mlqa", "test", "zh")
    qas = [{"id": r["id"], "question": r["question"], "answers": [
        {"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"], r["answers"]["answer_start"])]}
        for r in want]
    nested = {"data": [{"title": "长城", "paragraphs": [{"context": want[0]["context"], "qas": qas}]}]}
    (tmp_path / "test.zh.json").write_text(json.dumps(nested, ensure_ascii=False), "utf-8")
    got = load_task_split("mlqa", "zh", "test", tmp_path)
    assert [{k: r[k] for k in HUB_FIELDS["mlqa"]} for r in got] == want
    with open(tmp_path / "test.zh.csv", "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "context", "question", "answers"])
        writer.writeheader()
        writer.writerows({**r, "answers": json.dumps(r["answers"], ensure_ascii=False)} for r in want)
    assert load_task_split("mlqa", "zh", "test", tmp_path / "test.zh.csv") == want


def test_local_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="xquad has no split 'test' \\(splits: validation\\)"):
        load_task_split("xquad", "de", "test", FIXTURES / "xquad")
    with pytest.raises(FileNotFoundError, match=r"no test split for fr in .*xnli: expected test\.fr\.\{jsonl"):
        load_task_split("xnli", "fr", "test", FIXTURES / "xnli")
    bad = tmp_path / "test.de.jsonl"
    bad.write_text('{"premise": "a", "hypothesis": "b", "label": 1}\n\n{"premise": "a", "label": 0}\n', "utf-8")
    with pytest.raises(ValueError) as e:
        load_task_split("xnli", "de", "test", tmp_path)
    assert str(e.value) == f"{bad}, line 3: missing field 'hypothesis'"
    bad.write_text('{"premise": "a", "hypothesis": "b", "label": 3}\n', "utf-8")
    with pytest.raises(ValueError) as e:
        load_task_split("xnli", "de", "test", tmp_path)
    assert str(e.value) == f"{bad}, line 1: label 3 is not a label id 0..2"
    bad.write_text('{"premise": "a", "hypothesis": "b", "label": 1\n', "utf-8")
    with pytest.raises(ValueError, match="line 1: invalid JSON"):
        load_task_split("xnli", "de", "test", tmp_path)


def test_hub_path_calls_load_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def fake_load_dataset(path: str, name: str | None, split: str) -> datasets.Dataset:
        calls.append((path, name, split))
        return datasets.Dataset.from_list(load("mlqa", "test", "de"))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    assert load_task_split("mlqa", "de", "test") == load("mlqa", "test", "de")
    load_task_split("squad", "en", "train")
    load_task_split("xnli", "sw", "validation")
    assert calls == [("facebook/mlqa", "mlqa.de.de", "test"), ("rajpurkar/squad", None, "train"),
                     ("facebook/xnli", "sw", "validation")]
    with pytest.raises(ValueError, match="pawsx has no language 'tr' on the hub"):
        load_task_split("pawsx", "tr", "test")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return path


def test_local_classification_task(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"id": "a", "text": "x", "label": "yes"},
                                           {"id": "b", "text": "y", "label": "no"},
                                           {"id": "c", "text": "z", "label": "maybe"}])
    write_jsonl(tmp_path / "test.de.jsonl", [{"id": "d", "text": "ja", "label": "yes"}])
    task = LocalClassificationTask(tmp_path)
    assert task.labels == ("maybe", "no", "yes")
    assert task.load("train")[0] == {"id": "a", "text": "x", "label": 2}
    assert task.load("test", "de") == [{"id": "d", "text": "ja", "label": 2}]

    pairs = tmp_path / "pairs"
    pairs.mkdir()
    with open(pairs / "train.csv", "w", encoding="utf-8", newline="") as f:
        f.write("text_a,text_b,label\nfirst,second,10\nthird,fourth,2\n")
    task = LocalClassificationTask(pairs, text_fields=["text_a", "text_b"])
    assert task.labels == ("2", "10")  # integer labels sort numerically
    assert task.load("train") == [{"text_a": "first", "text_b": "second", "label": 1},
                                  {"text_a": "third", "text_b": "fourth", "label": 0}]
    with pytest.raises(ValueError) as e:
        LocalClassificationTask(pairs, text_fields=["text_a", "text_c"])
    assert str(e.value) == f"{pairs / 'train.csv'}, line 2: missing field 'text_c'"


def test_local_classification_errors(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "train.jsonl", [{"text": "x", "label": "yes"}, {"text": "y", "label": 1}])
    dev = write_jsonl(tmp_path / "dev.jsonl", [{"text": "x", "label": "yes"}, {"text": "y", "label": "no"}])
    task = LocalClassificationTask(tmp_path)
    assert task.labels == ("1", "yes")
    with pytest.raises(ValueError) as e:
        task.load("dev")
    assert str(e.value) == f"{dev}, line 2: label 'no' is not in the label set ['1', 'yes']"
    write_jsonl(dev, [{"text": "x", "label": "yes"}, {"txt": "y", "label": "yes"}])
    with pytest.raises(ValueError) as e:
        task.load("dev")
    assert str(e.value) == f"{dev}, line 2: missing field 'text'"
    with pytest.raises(FileNotFoundError, match=r"no test split for de in .*: expected test\.de\.\{jsonl"):
        task.load("test", "de")
    write_jsonl(dev, [{"text": "y", "label": "no"}])
    assert LocalClassificationTask(tmp_path, labels=["no", "yes"]).load("dev") == [{"text": "y", "label": 0}]


# ---------------------------------------------------------------------------------- featurisation


@pytest.mark.parametrize("text", ["Die Zugspitze ist mit 2962 Metern  der höchste Berg.",
                                  "埃菲尔铁塔位于法国巴黎，建于1889年，高约330米。", "  A lighthouse\tis a tower. "])
def test_encode_with_offsets(tokenizer: Tokenizer, text: str) -> None:
    ids, offsets = encode_with_offsets(tokenizer, text)
    assert ids == tokenizer.encode_one(text) and len(offsets) == len(ids)
    for i, (start, end) in zip(ids, offsets):
        piece = tokenizer.sp.id_to_piece(i).lstrip("▁")
        surface = text[start:end]
        assert surface == surface.strip()
        # NFKC maps "，" to ","; otherwise the piece is exactly the text it covers
        assert surface.replace("，", ",") == piece or i == 3  # <unk>


def test_classification_layout(tokenizer: Tokenizer) -> None:
    records = load("xnli", "test", "de")
    a, b = tokenizer.encode_one(records[0]["premise"]), tokenizer.encode_one(records[0]["hypothesis"])
    feats = encode_classification(records, tokenizer, ["premise", "hypothesis"])
    assert feats["input_ids"][0] == [BOS, *a, EOS, EOS, *b, EOS]
    assert feats["label"] == [0, 2, 1]
    single = encode_classification(records, tokenizer, ["premise"])
    assert single["input_ids"][0] == [BOS, *a, EOS]

    assert len(a) > len(b) + 1
    short = encode_classification(records[:1], tokenizer, ["premise", "hypothesis"], max_len=2 * len(b) + 5)
    assert short["input_ids"][0] == [BOS, *a[: len(b) + 1], EOS, EOS, *b, EOS]  # only the longer text shrinks
    even = encode_classification(records[:1], tokenizer, ["premise", "hypothesis"], max_len=2 * len(b) + 2)
    assert even["input_ids"][0] == [BOS, *a[: len(b) - 1], EOS, EOS, *b[:-1], EOS]  # then both, in turn
    assert len(encode_classification(records[:1], tokenizer, ["premise"], max_len=8)["input_ids"][0]) == 8


def test_truncate_pair() -> None:
    assert truncate_pair(5, 5, 7) == (4, 3)
    assert truncate_pair(10, 2, 8) == (6, 2)
    assert truncate_pair(3, 9, 6) == (3, 3)
    assert truncate_pair(3, 4, 20) == (3, 4)


SMALL = {"max_len": 40, "stride": 8, "max_query_len": 16}


@pytest.mark.parametrize(("task", "split", "lang"), QA_SPLITS)
def test_qa_answer_spans_map_back(tokenizer: Tokenizer, task: str, split: str, lang: str) -> None:
    records = load(task, split, lang)
    feats = encode_qa(records, tokenizer, **SMALL)
    by_id = {r["id"]: r for r in records}
    covered = set()
    for ids, offs, qid, s, e in zip(*feats.values()):
        assert len(ids) == len(offs) <= SMALL["max_len"]
        rec = by_id[qid]
        text, start = rec["answers"]["text"][0], rec["answers"]["answer_start"][0]
        if s == 0:
            assert e == 0
            continue
        covered.add(qid)
        span = rec["context"][offs[s][0] : offs[e][1]]
        assert text in span, (span, text)
        # minimal: the first and last tokens both overlap the answer
        assert offs[s][1] > start and offs[e][0] < start + len(text)
    assert covered == set(by_id)  # every answer lies wholly inside some window
    assert len(feats["input_ids"]) > len(records)  # the small windows split the contexts


def test_qa_answer_inside_a_token(tokenizer: Tokenizer) -> None:
    """An answer that starts and ends inside one token maps to that whole token."""
    rec = dict(load("mlqa", "test", "de")[0])
    _, offsets = encode_with_offsets(tokenizer, rec["context"])
    i, (a, b) = next((i, o) for i, o in enumerate(offsets) if o[1] - o[0] >= 4)
    rec["answers"] = {"text": [rec["context"][a + 1 : b - 1]], "answer_start": [a + 1]}
    feats = encode_qa([rec], tokenizer)
    assert len(feats["input_ids"]) == 1
    s, e, offs = feats["start_positions"][0], feats["end_positions"][0], feats["offsets"][0]
    assert s == e and offs[s] == (a, b)


def test_qa_windows_overlap_by_stride(tokenizer: Tokenizer) -> None:
    rec = load("xquad", "validation", "zh")[0]
    ctx_ids, ctx_offsets = encode_with_offsets(tokenizer, rec["context"])
    feats = encode_qa([rec], tokenizer, **SMALL)
    prefix = len(tokenizer.encode_one(rec["question"])) + 3
    windows = [(ids[prefix:-1], offs[prefix:-1]) for ids, offs in zip(feats["input_ids"], feats["offsets"])]
    assert len(windows) >= 3
    for ids, offs in zip(feats["input_ids"], feats["offsets"]):
        assert ids[:prefix] == [BOS, *tokenizer.encode_one(rec["question"]), EOS, EOS] and ids[-1] == EOS
        assert offs[:prefix] == [None] * prefix and offs[-1] is None
    for (ids_a, offs_a), (ids_b, offs_b) in zip(windows, windows[1:]):
        assert ids_a[-SMALL["stride"]:] == ids_b[: SMALL["stride"]]
        assert offs_a[-SMALL["stride"]:] == offs_b[: SMALL["stride"]]
    assert windows[0][1][0] == ctx_offsets[0] and windows[-1][1][-1] == ctx_offsets[-1]
    step = len(windows[0][0]) - SMALL["stride"]
    width = len(windows[0][0])
    assert [w[1] for w in windows[:-1]] == [ctx_offsets[i * step : i * step + width] for i in range(len(windows) - 1)]
    assert sum(len(w[0]) for w in windows) - SMALL["stride"] * (len(windows) - 1) == len(ctx_ids)
    with pytest.raises(ValueError, match="not more than stride"):
        encode_qa([rec], tokenizer, max_len=20, stride=8, max_query_len=16)


def test_qa_round_trip_through_decoding(tokenizer: Tokenizer) -> None:
    """Logits peaked at the gold positions decode back to the gold answers (SQuAD EM 100)."""
    records = load("squad", "train", "en") + load("mlqa", "test", "zh")
    feats = feature_rows(encode_qa(records, tokenizer, **SMALL))
    predictions = {}
    for rec in records:
        mine = [f for f in feats if f["example_id"] == rec["id"]]
        starts = [one_hot(torch.tensor(f["start_positions"]), len(f["input_ids"])).float() for f in mine]
        ends = [one_hot(torch.tensor(f["end_positions"]), len(f["input_ids"])).float() for f in mine]
        predictions[rec["id"]] = decode_spans(starts, ends, [f["offsets"] for f in mine], rec["context"])
    references = {r["id"]: r["answers"]["text"] for r in records}
    assert squad_scores(predictions, references) == {"exact_match": 100.0, "f1": 100.0}


# -------------------------------------------------------------------------------- span decoding

CONTEXT = "Paris is the capital of France"
#          0     6  9   13      21 24
OFFSETS = [None, None, None, (0, 5), (6, 8), (9, 12), (13, 20), (21, 23), (24, 30), None]


def test_decode_single_window() -> None:
    start = [9.0, 8.0, 0, 5.0, 0, 0, 1.0, 0, 0, 0]
    end = [9.0, 0, 8.0, 5.0, 0, 0, 2.0, 0, 0, 0]
    # the special / question tokens score highest but have no offsets
    assert decode_spans([start], [end], [OFFSETS], CONTEXT) == "Paris"
    # with n_best=1 only the <s> pair is considered: nothing valid
    assert decode_spans([start], [end], [OFFSETS], CONTEXT, n_best=1) == ""


def test_decode_skips_end_before_start_and_long_spans() -> None:
    start = [0, 0, 0, 1.0, 0, 0, 0, 0, 6.0, 0]  # best start: "France"
    end = [0, 0, 0, 5.5, 0, 0, 3.0, 0, 0, 0]  # best end: "Paris" (before "France")
    assert decode_spans([start], [end], [OFFSETS], CONTEXT) == "Paris"  # 1+5.5 > 6+0 (France..France)
    start = [-9.0, -9, -9, 4, -9, -9, -9, -9, -9, -9]
    end = [-9.0, -9, -9, 0, -9, -9, -9, -9, 5, 1]
    assert decode_spans([start], [end], [OFFSETS], CONTEXT) == CONTEXT
    assert decode_spans([start], [end], [OFFSETS], CONTEXT, max_answer_len=5) == "Paris"  # 6 tokens too long
    # padding beyond the offsets is never chosen
    padded = [0, 0, 0, 1.0, 0, 0, 0, 0, 0, 0, 50.0, 50.0]
    assert decode_spans([padded], [padded], [OFFSETS], CONTEXT) == "Paris"


def test_decode_chooses_across_windows() -> None:
    context = "alpha beta gamma delta epsilon"
    #          0     6    11    17    23
    win1 = [None, None, None, (0, 5), (6, 10), (11, 16), None]
    win2 = [None, None, None, (11, 16), (17, 22), (23, 30), None]
    start1, end1 = [0, 0, 0, 2.0, 0, 1.0, 0], [0, 0, 0, 0, 2.5, 0, 0]  # best "alpha beta" = 4.5
    start2, end2 = [0, 0, 0, 0, 3.0, 0, 0], [0, 0, 0, 0, 0, 2.0, 0]  # best "delta epsilon" = 5.0
    assert decode_spans([start1, start2], [end1, end2], [win1, win2], context) == "delta epsilon"
    end2[5] = 1.0
    assert decode_spans([start1, start2], [end1, end2], [win1, win2], context) == "alpha beta"
    assert decode_spans([torch.tensor(start1)], [torch.tensor(end1)], [win1], context) == "alpha beta"


def test_pad_collate(tokenizer: Tokenizer) -> None:
    rows = feature_rows(encode_classification(load("xnli", "test", "en"), tokenizer, ["premise", "hypothesis"]))
    batch = pad_collate(rows)
    lengths = [len(r["input_ids"]) for r in rows]
    assert batch["input_ids"].shape == (3, max(lengths)) and batch["label"].tolist() == [0, 2, 1]
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert (batch["input_ids"][~batch["attention_mask"]] == PAD).all()
    assert batch["input_ids"][0, : lengths[0]].tolist() == rows[0]["input_ids"]

    qa = pad_collate(feature_rows(encode_qa(load("mlqa", "test", "de"), tokenizer, **SMALL)))
    assert qa["start_positions"].dtype == torch.long and isinstance(qa["offsets"], list)
    assert qa["example_id"][0] == "mlqa-de-0001"

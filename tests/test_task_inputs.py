"""What featurisation does to a task's examples and how they are named (issue 29 parts 7-8): examples longer than
``max_len`` are counted per file, exactly, in the log, in what finetuning and evaluation record and in the report;
saved predictions carry the id column (``tasks.X.id_field``, else ``id``, else the 0-based position)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minimodel.config.schema import TaskConfig
from minimodel.data.tasks import TaskData
from minimodel.data.tokenizer import SpecialTokens
from minimodel.errors import TaskDataError
from minimodel.report.document import render_report
from minimodel.report.reading import results_from_rows
from minimodel.store.truncation import Truncation, read_dir, report_section, write

LONG = " ".join(f"w{i}" for i in range(80))  # 80 words: more tokens than max_len 32 with any tokenizer here
SIZES = {"train": (10, 3), "dev": (6, 1), "test.en": (4, 0), "test.de": (6, 2), "test.tr": (5, 4)}
"""file -> (examples, of which long); the long ones come first."""


class Words:
    """A tokenizer with one token per whitespace-separated word (the counts are then known by construction)."""

    specials = SpecialTokens(bos=0, pad=1, eos=2, unk=3, mask=4)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return [[5 + len(w) for w in t.split()] for t in texts]


def write_task(root: Path, id_column: str = "ref") -> Path:
    """A CSV task (columns ``id_column``, text, label): per file of ``SIZES``, its long examples and short ones."""
    root.mkdir(parents=True, exist_ok=True)
    for name, (n, long) in SIZES.items():
        lines = [f"{id_column},text,label"] + [
            f"{name}-r{i},{LONG if i < long else 'ja nein'},{'ab'[i % 2]}" for i in range(n)]
        (root / f"{name}.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def test_featurisation_counts_the_examples_it_cuts(tmp_path):
    data = TaskData("long", TaskConfig(kind="local", source=str(write_task(tmp_path / "long")), max_len=32))
    for name, (n, long) in SIZES.items():
        split, _, lang = name.partition(".")
        records = data.records(split, lang or "en")
        features, cut = data.featurise(records, Words())
        assert (len(features), cut) == (n, long)
        assert all(len(f["input_ids"]) <= 32 for f in features) and "truncated" not in features[0]
    # a pair: cut when the two texts together are too long, though each would fit alone
    pair = TaskData("pair", TaskConfig(kind="local", source=str(tmp_path / "long"), text_fields=["text", "text"],
                                       max_len=32))
    features, cut = pair.featurise([{"text": " ".join(["x"] * 15), "label": 0}], Words())  # 2 x 15 + 4 > 32
    assert cut == 1 and len(features[0]["input_ids"]) == 32
    assert pair.featurise([{"text": " ".join(["x"] * 14), "label": 0}], Words())[1] == 0  # 2 x 14 + 4 = 32: fits


def test_the_report_says_what_was_cut_per_file(tmp_path):
    t = Truncation("long", "train", "en", "/d/train.csv", 64, 3000, 900)
    assert t.message() == ("tasks.long: train (en) (/d/train.csv): 30% (900 of 3,000) examples are longer than "
                           "max_len 64 tokens and were truncated to it (the longer text loses its last tokens)")
    records = [t, Truncation("long", "test", "tr", "", 64, 300, 114), Truncation("long", "test", "en", "", 64, 300, 3),
               Truncation("long", "test", "fr", "", 64, 300, 9)]  # fr: no results, left out
    for r in records:
        write(tmp_path / "bl_base" / "truncation" / r.task / f"{r.split}.{r.lang}.json", r)
    (tmp_path / "bl_base" / "truncation" / "long" / "junk.json").write_text("[1]")  # skipped
    found = read_dir(tmp_path / "bl_base")
    assert sorted(found, key=str) == sorted(records, key=str)
    lines = report_section({"bl_base": found, "minipost": found}, ["long"], {"long": ["tr"]}, "test")
    assert lines[-2] == ("- long: truncated to max_len 64: train (en) 30% (900 of 3,000), test en 1% (3 of 300), "
                         "test tr 38% (114 of 300)")
    other = [Truncation("long", "train", "en", "/d/train.csv", 64, 3000, 0)]
    lines = report_section({"bl_base": found, "bl_small": other}, ["long"], {"long": ["tr"]}, "test")
    assert lines[-3:-1] == ["- long (bl_base): truncated to max_len 64: train (en) 30% (900 of 3,000), test en 1% "
                            "(3 of 300), test tr 38% (114 of 300)",
                            "- long (bl_small): truncated to max_len 64: train (en) 0% (0 of 3,000)"]
    assert report_section({"bl_base": found}, ["other"], {}, "test") == []
    row = {"system": "bl_base", "body": "primary", "task": "long", "lang": "tr", "seed": 1, "step": 4, "flops": 1.0,
           "v100_days": 1.0, "split": "test", "metric": "accuracy", "value": 50.0}
    report = render_report(results_from_rows([row]), "x", {}, truncation=lines)
    assert report.endswith("\n".join(lines))


# ---- part 8: the ids of saved predictions -------------------------------------------------------------------------

def _prediction_ids(data: TaskData, split: str, lang: str) -> list:
    from minimodel.data.downstream import prediction_rows

    records = data.records(split, lang)
    features = data.features(records, Words())
    predictions = [(0, [1.0, 0.0]) for _ in features]
    return [row["id"] for row in prediction_rows(data, records, features, predictions)]


def test_predictions_carry_the_id_column(tmp_path):
    root = write_task(tmp_path / "long")
    named = TaskData("long", TaskConfig(kind="local", source=str(root), id_field="ref"))
    assert _prediction_ids(named, "test", "de") == [f"test.de-r{i}" for i in range(6)]
    # no id_field: the 'id' column where there is one, else the record's 0-based position in its file
    assert _prediction_ids(TaskData("long", TaskConfig(kind="local", source=str(root))), "test", "de") == list(range(6))
    with_id = write_task(tmp_path / "with_id", id_column="id")
    default = TaskData("long", TaskConfig(kind="local", source=str(with_id)))
    assert _prediction_ids(default, "test", "tr") == [f"test.tr-r{i}" for i in range(5)]


def test_an_id_field_the_file_lacks_is_refused_naming_file_and_column(tmp_path):
    root = write_task(tmp_path / "long")
    (root / "test.tr.csv").write_text("id,text,label\nx,ja,a\n", encoding="utf-8")  # this one has no 'ref'
    data = TaskData("long", TaskConfig(kind="local", source=str(root), id_field="ref"))
    data.records("test", "de")
    with pytest.raises(TaskDataError, match=rf"^{root / 'test.tr.csv'}, line 2: missing field 'ref' "
                                            r"\(tasks.long.id_field names it as the id column: set it to one of the "
                                            r"file's columns \['id', 'text', 'label'\], or leave it unset to use "
                                            r"the 'id' column or the record's position\)$"):
        data.records("test", "tr")
    with pytest.raises(TaskDataError, match=rf"^{root / 'train.csv'}, line 2: missing field 'reference' "):
        TaskData("long", TaskConfig(kind="local", source=str(root), id_field="reference"))  # train: read at once


def test_a_hub_task_takes_its_ids_from_the_id_field(tmp_path):
    """pawsx in the hub schema from local files: its 'id' by default, another column when named."""
    from minimodel.data.hub_tasks import load_task_split

    (tmp_path / "test.de.jsonl").write_text(
        "\n".join(json.dumps({"id": i, "pair": f"p{i}", "sentence1": "a", "sentence2": "b", "label": 1})
                  for i in range(3)) + "\n", encoding="utf-8")
    assert [r["id"] for r in load_task_split("pawsx", "de", "test", tmp_path)] == [0, 1, 2]
    assert [r["id"] for r in load_task_split("pawsx", "de", "test", tmp_path, "pair")] == ["p0", "p1", "p2"]
    with pytest.raises(TaskDataError, match=rf"^{tmp_path / 'test.de.jsonl'}, line 1: missing field 'ref' "
                                            r"\(tasks.pawsx.id_field names it"):
        load_task_split("pawsx", "de", "test", tmp_path, "ref")


# ---- end to end: the log, the recorded files, the report and the predictions of one run --------------------------

@pytest.mark.slow
def test_a_run_says_what_it_cut_and_names_predictions_by_the_id_column(tiny_finetuned, tmp_path, capsys):
    tmp, cfg, args = tiny_finetuned
    root = write_task(tmp_path / "long")
    exp = tmp_path / "long.yaml"
    exp.write_text(f"""extends: {Path(__file__).resolve().parent.parent / 'experiments' / 'tiny.yaml'}
name: long
models_from: tiny
tasks:
  long:
    kind: local
    source: {root}
    max_len: 32
    id_field: ref
""")
    from minimodel.cli import main

    assert main(["run", str(exp), *args[1:], "finetune.tasks=[long]", "finetune.seeds=[1]", "--no-progress"]) == 0
    err = capsys.readouterr().err
    mine = Path(cfg.runs_dir) / "long" / "bl_base"
    expected = {("train", "en"): (10, 3, "train.csv"), ("dev", "en"): (6, 1, "dev.csv"),
                ("test", "de"): (6, 2, "test.de.csv"), ("test", "tr"): (5, 4, "test.tr.csv")}
    for (split, lang), (n, cut, file) in expected.items():
        t = Truncation("long", split, lang, str(root / file), 32, n, cut)
        assert err.count(f"[minimodel] {t.message()}\n") == 1, t.message()  # once per file
        assert Truncation.from_dict(json.loads(
            (mine / "truncation" / "long" / f"{split}.{lang}.json").read_text())) == t
    assert "test en" not in err  # nothing cut there: nothing said
    done = json.loads((mine / "finetune" / "long" / "seed1" / "done.json").read_text())
    assert [(t["split"], t["examples"], t["truncated"]) for t in done["truncation"]] == [
        ("train", 10, 3), ("dev", 6, 1), ("test", 4, 0)]
    report = (Path(cfg.runs_dir) / "long" / "report.md").read_text()
    assert ("- long: truncated to max_len 32: train (en) 30% (3 of 10), test en 0% (0 of 4), test de 33% (2 of 6), "
            "test tr 80% (4 of 5)\n") in report
    final = max(int(p.stem.split("step")[1]) for p in (mine / "predictions" / "long" / "de").iterdir())
    for lang, n in (("de", 6), ("tr", 5)):
        rows = [json.loads(line) for line in
                (mine / "predictions" / "long" / lang / f"seed1-step{final:07d}.jsonl").read_text().splitlines()]
        assert [r["id"] for r in rows] == [f"test.{lang}-r{i}" for i in range(n)]

